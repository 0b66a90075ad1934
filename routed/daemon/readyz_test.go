package daemon

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestReadyzDetails: the lines ReadyDetails gives are in /readyz's body,
// after "ok" (200) or the reason (503), and change neither.
func TestReadyzDetails(t *testing.T) {
	d := New(Config{NodeName: "n"}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	d.ReadyDetails(func() []string { return []string{"leak reconcile: the runtime is wrong"} })
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusServiceUnavailable || body != "node informer not synced\nwarning: leak reconcile: the runtime is wrong\n" {
		t.Errorf("before sync: %d %q", code, body)
	}
	d.synced.Store(true)
	d.lastApplyOK.Store(true)
	if code, body := get(); code != http.StatusOK || body != "ok\nwarning: leak reconcile: the runtime is wrong\n" {
		t.Errorf("ready: %d %q", code, body)
	}
	d.ReadyDetails(func() []string { return nil })
	if code, body := get(); code != http.StatusOK || body != "ok\n" {
		t.Errorf("ready, nothing to say: %d %q", code, body)
	}
}
