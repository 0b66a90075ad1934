package daemon

import (
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"

	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/routed/kube"
)

// Event reasons podnet-routed gives the Nodes it refuses and accepts again.
const (
	EventNodeRefused  = "NodeRefused"
	EventNodeAccepted = "NodeAccepted"
	// EventPodCIDRFamilyMissing: a Node of a dual-stack cluster with
	// PodCIDRs of one family only (not refused: that family routes).
	EventPodCIDRFamilyMissing = "PodCIDRFamilyMissing"
)

// refusals keeps what has been reported of the Nodes validation refuses,
// so that every change (refused, a new reason, accepted again) is said
// once: a log line, a Kubernetes Event on the Node, the gauge.
type refusals struct {
	self     string
	log      *slog.Logger
	events   *kube.EventSink // nil: no Events (tests of the loop alone)
	gauge    func(reason desired.Reason, n int)
	reported map[string]desired.Refusal
	count    map[desired.Reason]int
}

func newRefusals(self string, log *slog.Logger, events *kube.EventSink, gauge func(desired.Reason, int)) *refusals {
	r := &refusals{self: self, log: log, events: events, gauge: gauge, reported: map[string]desired.Refusal{}, count: map[desired.Reason]int{}}
	for _, reason := range desired.Reasons {
		gauge(reason, 0)
	}
	return r
}

// sync reports the refusals of now for the Nodes named (all Nodes when
// names is nil: after a full apply). exists tells a refused Node that is
// fixed from one that was deleted.
func (r *refusals) sync(now map[string]desired.Refusal, names []string, exists func(string) bool) {
	for _, name := range namesToSync(r.reported, now, names) {
		was, had := r.reported[name]
		cur, has := now[name]
		switch {
		case has && (!had || was != cur):
			if had {
				r.add(was.Reason, -1)
			}
			r.add(cur.Reason, 1)
			r.reported[name] = cur
			r.log.Warn("node refused", "node", name, "reason", cur.Reason, "detail", cur.Detail)
			r.event(name, corev1.EventTypeWarning, EventNodeRefused, cur.Detail+" (no route to it until this is fixed)")
		case !has && had:
			r.add(was.Reason, -1)
			delete(r.reported, name)
			if exists != nil && !exists(name) {
				r.log.Info("refused node deleted", "node", name, "was", was.Reason)
				continue
			}
			r.log.Info("node accepted", "node", name, "was", was.Reason)
			r.event(name, corev1.EventTypeNormal, EventNodeAccepted, fmt.Sprintf("Node %s is routed again (it was refused: %s)", name, was.Reason))
		}
	}
}

func (r *refusals) add(reason desired.Reason, d int) {
	r.count[reason] += d
	r.gauge(reason, r.count[reason])
}

func (r *refusals) event(node, typ, reason, msg string) {
	if r.events != nil {
		r.events.Node(node, typ, reason, fmt.Sprintf("podnet-routed on %s: %s", r.self, msg))
	}
}

// familyNotes keeps what has been reported of the Nodes that lack a
// PodCIDR family of a dual-stack cluster (desired.MissingFamily), so that
// each is said once, as refusals are: a log line, a Warning Event on the
// Node, the gauge.
type familyNotes struct {
	refusals *refusals // its self, log and events
	gauge    func(n int)
	reported map[string]string
}

func newFamilyNotes(r *refusals, gauge func(int)) *familyNotes {
	gauge(0)
	return &familyNotes{refusals: r, gauge: gauge, reported: map[string]string{}}
}

// sync reports the notes of now for the Nodes named (all Nodes when names
// is nil: after a full apply).
func (f *familyNotes) sync(now map[string]string, names []string) {
	for _, name := range namesToSync(f.reported, now, names) {
		was, had := f.reported[name]
		cur, has := now[name]
		switch {
		case has && (!had || was != cur):
			f.reported[name] = cur
			f.refusals.log.Warn("node lacks a PodCIDR family", "node", name, "reason", EventPodCIDRFamilyMissing, "detail", cur)
			f.refusals.event(name, corev1.EventTypeWarning, EventPodCIDRFamilyMissing, cur)
		case !has && had:
			delete(f.reported, name)
			f.refusals.log.Info("node has both PodCIDR families now, or is gone", "node", name)
		}
	}
	f.gauge(len(f.reported))
}

// NodeEvent posts an Event on this node's own Node (nothing without an
// API client for Events): what another loop of podnet-routed (the policy
// engine) has to tell the operator about the node.
func (d *Daemon) NodeEvent(typ, reason, msg string) {
	if d.events != nil {
		d.events.Node(d.cfg.NodeName, typ, reason, fmt.Sprintf("podnet-routed on %s: %s", d.cfg.NodeName, msg))
	}
}

// namesToSync is names, or when it is nil (a full apply) every Node that
// was reported or is now.
func namesToSync[V any](reported, now map[string]V, names []string) []string {
	if names != nil {
		return names
	}
	for name := range reported {
		names = append(names, name)
	}
	for name := range now {
		if _, ok := reported[name]; !ok {
			names = append(names, name)
		}
	}
	return names
}
