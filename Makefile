# fleetlimit: a fault-tolerant distributed rate limiter.
# `make help` lists the targets (README.md, "Development"); the scripts they call live in
# scripts/.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

# nginx and redis-server live in /usr/sbin on Debian, outside an ordinary user's PATH.
export PATH := $(PATH):/usr/local/sbin:/usr/sbin:/sbin

GO ?= go
# staticcheck 2026.2.2; staticcheck's proxy versions are v0.x (its 20xx.y tags are not
# served by the module proxy).
STATICCHECK_VERSION ?= v0.8.2
# Chaos scenarios, comma separated (empty: all). e.g. make chaos-local SCENARIOS=redis-kill
SCENARIOS ?=
CHAOS_ARGS ?=
# make bench BENCH_ARGS="-cell 5s" (flags of loadtest/cmd/bench); BENCH_MEM_KEYS=10000000 sizes the memory rows
BENCH_ARGS ?=
# make keys N=<n>
N ?= 1
# make up|down|local-up TOPOLOGY=sentinel|cluster (FLEET_TOPOLOGY of scripts/compose-up.sh
# and scripts/compose-down.sh, LOCAL_TOPOLOGY of scripts/local-up.sh; empty: single)
TOPOLOGY ?=

# Every module of the workspace (go.work's `use` lines): app, chaos and loadtest.
# Evaluated when a recipe needs it.
MODULES = $(shell $(GO) list -m -f '{{.Dir}}')

CHAOS_SCENARIO_FLAG = $(if $(strip $(SCENARIOS)),-scenarios $(SCENARIOS))

.PHONY: help up down offline-images local-up local-down test chaos-local chaos bench lint generate tidy \
	deps check-config nginx-conf build keys reload top

help: ## list the targets
	@echo "usage: make TARGET"
	@echo ""
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN { FS = ":.*## " } { printf "  %-14s %s\n", $$1, $$2 }'

# ---- the two stacks ---------------------------------------------------------------

up: ## compose stack: nginx on :8080, app1-app4, Redis; waits until all are healthy; TOPOLOGY=sentinel|cluster
	@$(if $(strip $(TOPOLOGY)),FLEET_TOPOLOGY=$(strip $(TOPOLOGY)) )scripts/compose-up.sh

offline-images: ## local stand-ins for every image compose and the Dockerfile name (no registry needed); writes .env
	@scripts/offline-images.sh

down: ## stop the compose stack, whichever topology it runs (volumes are kept)
	@$(if $(strip $(TOPOLOGY)),FLEET_TOPOLOGY=$(strip $(TOPOLOGY)) )scripts/compose-down.sh

local-up: ## native stack without Docker (redis-server, toxiproxy, 4 apps, nginx); writes .run/stack.json; TOPOLOGY=sentinel|cluster
	@$(if $(strip $(TOPOLOGY)),LOCAL_TOPOLOGY=$(strip $(TOPOLOGY)) )scripts/local-up.sh

local-down: ## stop what local-up started (pids in .run/pids/), keep the logs
	@scripts/local-down.sh

keys: ## print N API keys the running stack accepts (signed with its RL_API_KEY_SECRET); make keys N=3
	@scripts/keys.sh $(N)

reload: ## every instance of the running stack (native, else compose) re-reads its policy file; prints each one's policy version, and why a bad file changed nothing
	@$(if $(strip $(TOPOLOGY)),FLEET_TOPOLOGY=$(strip $(TOPOLOGY)) )scripts/reload.sh

top: ## the identities the running stack (native, else compose) refused most over the last minute, summed over its instances; make top POLICY=<name>
	@$(if $(strip $(TOPOLOGY)),FLEET_TOPOLOGY=$(strip $(TOPOLOGY)) )scripts/top.sh $(POLICY)

build: ## build bin/ratelimiter
	$(GO) build -o bin/ratelimiter ./app/cmd/ratelimiter

# ---- tests ------------------------------------------------------------------------

test: deps ## deps, go vet and go test -race of every module, nginx -t, compose config, promtool on the rules
	@failed=""; \
	for dir in $(MODULES); do \
		echo "==> go vet ($$dir)"; \
		(cd "$$dir" && $(GO) vet ./...) || failed="$$failed vet:$$dir"; \
	done; \
	for dir in $(MODULES); do \
		echo "==> go test -race ($$dir)"; \
		(cd "$$dir" && $(GO) test -race -shuffle=on -count=1 ./...) || failed="$$failed test:$$dir"; \
	done; \
	echo "==> deployment files"; \
	scripts/check-config.sh || failed="$$failed check-config"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: all passed"

check-config: ## only the deployment checks: scripts, nginx -t (native, no root), compose config
	@scripts/check-config.sh

chaos-local: ## chaos suite against the native stack (it starts and stops the stack); SCENARIOS=a,b
	$(GO) run ./chaos/cmd/chaos -stack local $(CHAOS_SCENARIO_FLAG) $(CHAOS_ARGS)

chaos: ## chaos suite against the compose stack; SCENARIOS=a,b
	$(GO) run ./chaos/cmd/chaos -stack compose $(CHAOS_SCENARIO_FLAG) $(CHAOS_ARGS)

bench: ## ours beside the peers and the Redis ceiling, one run: bench-out/results.json, docs/BENCHMARKS.md
	@scripts/bench.sh $(BENCH_ARGS)

# ---- code hygiene -----------------------------------------------------------------

lint: ## go vet, gofmt and staticcheck over every module; shellcheck over scripts/
	@failed=""; \
	for dir in $(MODULES); do \
		echo "==> lint ($$dir)"; \
		(cd "$$dir" && $(GO) vet ./...) || failed="$$failed vet:$$dir"; \
		unformatted=$$(cd "$$dir" && gofmt -l .); \
		if [ -n "$$unformatted" ]; then \
			echo "gofmt: these files need formatting (gofmt -w):"; echo "$$unformatted"; \
			failed="$$failed gofmt:$$dir"; \
		fi; \
		(cd "$$dir" && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...) || \
			failed="$$failed staticcheck:$$dir"; \
	done; \
	if command -v shellcheck >/dev/null 2>&1; then \
		echo "==> shellcheck"; \
		shellcheck -x scripts/*.sh scripts/lib/*.sh .ci/run || failed="$$failed shellcheck"; \
	else \
		echo "lint: shellcheck not installed (apt-get install shellcheck): shell scripts not linted"; \
	fi; \
	if [ -n "$$failed" ]; then echo "make lint: FAILED:$$failed"; exit 1; fi

generate: ## regenerate the mocks (mockery, a tool of the app module)
	cd app && $(GO) tool mockery

tidy: ## go mod tidy in every module; fails when that changed go.mod/go.sum
	@for dir in $(MODULES); do \
		echo "==> go mod tidy ($$dir)"; \
		(cd "$$dir" && $(GO) mod tidy); \
	done
	@changes=$$(git status --porcelain -- '*go.mod' '*go.sum' 'go.work' 'go.work.sum'); \
	if [ -n "$$changes" ]; then \
		echo "$$changes"; git --no-pager diff -- '*go.mod' '*go.sum' 'go.work' 'go.work.sum'; \
		echo "tidy: go.mod/go.sum differ from what is committed (see above)"; exit 1; \
	fi

deps: ## install redis-server, nginx-light, curl, gcc, prometheus (promtool) if missing (root + apt), else say what to install
	@scripts/deps.sh

nginx-conf: ## regenerate nginx/nginx.conf and nginx/static.conf (compose) from their templates
	scripts/render-nginx.sh compose nginx/nginx.conf
	NGINX_TEMPLATE=nginx/static.conf.template scripts/render-nginx.sh compose nginx/static.conf
