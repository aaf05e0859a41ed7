package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// httpAPI is what both stacks reach over HTTP on the host's loopback: the
// apps' admin endpoints and toxiproxy's API.
type httpAPI struct {
	client *http.Client
}

func newHTTPAPI() httpAPI { return httpAPI{client: &http.Client{Timeout: 5 * time.Second}} }

// LatencyToxic is the name of the toxic Latency adds.
const LatencyToxic = "chaos-latency"

// latency adds (d > 0) or removes a latency toxic on the downstream (Redis to
// app) of every app's proxy: toxiproxy delays each reply by d, plus or minus
// up to jitter.
func (h httpAPI) latency(ctx context.Context, info Info, d, jitter time.Duration) error {
	var errs []error
	for _, a := range info.Apps {
		if d > 0 {
			body := fmt.Sprintf(`{"name":%q,"type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":%d,"jitter":%d}}`,
				LatencyToxic, d.Milliseconds(), min(jitter, d).Milliseconds())
			errs = append(errs, h.proxyCall(ctx, info.ProxyAPI, http.MethodPost, "/proxies/"+a.Proxy+"/toxics", body, false))
		} else {
			errs = append(errs, h.proxyCall(ctx, info.ProxyAPI, http.MethodDelete, "/proxies/"+a.Proxy+"/toxics/"+LatencyToxic, "", true))
		}
	}
	return errors.Join(errs...)
}

// setClock sets app's wall clock offset (POST /debug/clock on its admin
// port, which the chaos stacks open with RL_DEBUG_CLOCK).
func (h httpAPI) setClock(ctx context.Context, info Info, app string, offset time.Duration) error {
	admin, err := adminURL(info, app)
	if err != nil {
		return err
	}
	body := fmt.Sprintf(`{"offset":%q}`, offset.String())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, admin+"/debug/clock", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+info.AdminToken)
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s clock: %w", app, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s clock: %s: %s", app, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// proxyCall sends one request to toxiproxy's API at api.
func (h httpAPI) proxyCall(ctx context.Context, api, method, path, body string, allow404 bool) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(api, "/")+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("toxiproxy %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusNotFound && allow404 {
		return nil
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("toxiproxy %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// status GETs the app's admin /status.
func (h httpAPI) status(ctx context.Context, info Info, app string) ([]byte, error) {
	admin, err := adminURL(info, app)
	if err != nil {
		return nil, err
	}
	return h.get(ctx, admin+"/status")
}

// waitReady polls the app's admin /readyz until it answers 2xx, for at most d.
func (h httpAPI) waitReady(ctx context.Context, info Info, app string, d time.Duration) error {
	admin, err := adminURL(info, app)
	if err != nil {
		return err
	}
	return waitFor(ctx, d, func(ctx context.Context) error {
		_, err := h.get(ctx, admin+"/readyz")
		return err
	})
}

func adminURL(info Info, app string) (string, error) {
	for _, a := range info.Apps {
		if a.Name == app && a.AdminURL != "" {
			return strings.TrimRight(a.AdminURL, "/"), nil
		}
	}
	return "", fmt.Errorf("%s: no admin URL in the stack's description", app)
}

func (h httpAPI) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return b, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}
