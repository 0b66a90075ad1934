// podnet-routed's HTTP side: /healthz, /readyz (and what makes it fail)
// and /metrics.

package daemon

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /healthz, /readyz and /metrics.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := http.StatusOK, "ok"
		if p := d.notReady(); p != "" {
			code, body = http.StatusServiceUnavailable, p
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		fmt.Fprintln(w, body)
		// What the other loops want an operator to see: never a reason
		// to take the node out (its pods' network works), so shown
		// whatever the answer is.
		if d.readyDetails != nil {
			for _, line := range d.readyDetails() {
				fmt.Fprintln(w, "warning: "+line)
			}
		}
	})
	// uncompressed: a few kB of text, while each gzip writer promhttp
	// pools holds ~800 kB of the heap between scrapes
	mux.Handle("/metrics", promhttp.HandlerFor(d.metrics.Registry, promhttp.HandlerOpts{DisableCompression: true}))
	return mux
}

// notReady says why /readyz fails ("": it does not).
func (d *Daemon) notReady() string {
	if !d.synced.Load() {
		return "node informer not synced"
	}
	if p := d.selfProblem.Load().(string); p != "" {
		return p
	}
	if t := d.cfg.APIServerTimeout; t > 0 && d.unreachableFor() > t.Seconds() {
		return fmt.Sprintf("API server unreachable for %.0fs (more than --apiserver-timeout %s)", d.unreachableFor(), t)
	}
	if !d.lastApplyOK.Load() {
		return "the last apply of this node's own devices, blackhole or node.json failed, or none was done yet (see the log)"
	}
	return ""
}

// ReadyDetails makes /readyz add f's lines (prefixed "warning: ") to its
// answer, 200 or 503, without changing it: the leak reconcile's Status.
// Set it before Handler serves.
func (d *Daemon) ReadyDetails(f func() []string) *Daemon {
	d.readyDetails = f
	return d
}
