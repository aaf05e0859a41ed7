# The rate-limiter service image: a static Go binary on distroless, running as non-root.
#
#   docker build -t fleetlimit/ratelimiter:dev .
#   docker build --build-arg GO_IMAGE=... --build-arg RUNTIME_IMAGE=... .   # mirrors
#
# Works with the classic builder and BuildKit alike (no `# syntax=` line, no RUN --mount:
# neither needs to pull a frontend image), so compose v1 builds it too.

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# ---- build -------------------------------------------------------------------------
FROM ${GO_IMAGE} AS build

# Optional module proxy for builds behind a mirror (empty: Go's default).
ARG GOPROXY
ENV GOPROXY=${GOPROXY} \
    CGO_ENABLED=0 \
    GOOS=linux

WORKDIR /src

# The repository is a go.work workspace (app, app/ratelimit, chaos and loadtest), but
# the service needs only the `app` module and the library it replaces in from
# ./ratelimit: build inside app/ with the workspace off, so the image does not need the
# other modules (which .dockerignore keeps out of the context). Dependencies first, in
# their own layer, so a code change does not download them again.
COPY app/go.mod app/go.sum ./app/
COPY app/ratelimit/go.mod app/ratelimit/go.sum ./app/ratelimit/
RUN cd app && GOWORK=off go mod download

COPY app/ ./app/
RUN cd app && GOWORK=off go build -trimpath -ldflags "-s -w" -o /out/ratelimiter ./cmd/ratelimiter

# An empty directory to become the journal directory, owned by the runtime user
# (distroless has no shell to mkdir in). A named volume mounted there starts with this
# ownership.
RUN mkdir -p /out/journal

# ---- runtime -----------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}

COPY --from=build /out/ratelimiter /usr/local/bin/ratelimiter
# Only the journal directory itself gets the owner (its parents stay root's).
COPY --from=build --chown=65532:65532 /out/journal/ /var/lib/ratelimiter/journal/

# distroless "nonroot": uid/gid 65532. Numeric, so `runAsNonRoot` checks can verify it.
USER 65532:65532

# Settings: README.md, "Configuration". These are the image's defaults; compose sets the rest.
# The admin port (/metrics /status POST /admin/reset) keeps the service's default,
# 127.0.0.1:9090, the container's own loopback (its -healthcheck reaches it there): a
# deployment whose Prometheus scrapes it sets RL_ADMIN_ADDR=:9090, as compose does.
ENV RL_LISTEN_ADDR=:8080 \
    RL_JOURNAL_DIR=/var/lib/ratelimiter/journal

# 8080: the API (behind nginx). 9090: admin (/healthz /readyz /metrics /status
# POST /admin/reset), never routed by nginx.
EXPOSE 8080 9090

# distroless has no curl or wget: the binary probes itself (`-healthcheck URL` GETs the
# URL with a 2 s timeout and exits 0 on a 2xx answer, 1 otherwise).
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/ratelimiter", "-healthcheck", "http://127.0.0.1:9090/healthz"]

ENTRYPOINT ["/usr/local/bin/ratelimiter"]
