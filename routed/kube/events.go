// Events posted from podnet-routed: about Nodes (the daemon's refusals)
// and about NetworkPolicies (one per cluster, named alike on every node).

package kube

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// EventSink posts core/v1 Events from a goroutine of its own (Run), so
// that an apply never waits for the API server; when the queue is full,
// an Event is dropped (and logged), never the apply.
type EventSink struct {
	client rest.Interface
	host   string
	log    *slog.Logger
	queue  chan *corev1.Event
}

// NewEventSink posts through client (core/v1) as podnet-routed on host;
// Run sends.
func NewEventSink(client rest.Interface, host string, log *slog.Logger) *EventSink {
	return &EventSink{client: client, host: host, log: log, queue: make(chan *corev1.Event, 256)}
}

// Node queues an Event about Node node (never blocks: a full queue drops
// it, logged).
func (s *EventSink) Node(node, typ, reason, msg string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + ".podnet-", Namespace: metav1.NamespaceDefault},
		// Nodes are cluster-scoped; kubectl describe node finds Events by
		// kind, name and UID-less reference in namespace default
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, APIVersion: "v1"},
		Reason:         reason,
		Message:        msg,
		Type:           typ,
		Source:         corev1.EventSource{Component: "podnet-routed", Host: s.host},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	s.send(ev)
}

// send queues ev; a full queue drops it (logged).
func (s *EventSink) send(ev *corev1.Event) {
	select {
	case s.queue <- ev:
	default:
		s.log.Warn("event queue full: event dropped", "kind", ev.InvolvedObject.Kind, "name", ev.InvolvedObject.Name, "reason", ev.Reason)
	}
}

// Run posts the queued Events until ctx ends.
func (s *EventSink) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-s.queue:
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := s.client.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(cctx).Error()
			cancel()
			switch {
			case err == nil:
			case ev.Name != "" && apierrors.IsAlreadyExists(err):
				// another node posted this very Event first
				s.log.Debug("event already posted", "name", ev.Name)
			default:
				s.log.Warn("cannot post event", "kind", ev.InvolvedObject.Kind, "name", ev.InvolvedObject.Name, "reason", ev.Reason, "err", err)
			}
		}
	}
}

// PolicyEvents posts Events about NetworkPolicies for the policy engine.
// Every node's engine judges a policy the same way, so an Event is named
// after the policy's UID, the reason and the message (PolicyEventName):
// the first node to post creates it, the others find it there
// (AlreadyExists) and add nothing. A cluster gets one Event per refusal,
// not one per node, and no leader is elected for it.
type PolicyEvents struct {
	sink *EventSink
}

// NewPolicyEvents posts through client (core/v1) as podnet-routed on host;
// Run sends.
func NewPolicyEvents(client rest.Interface, host string, log *slog.Logger) *PolicyEvents {
	return &PolicyEvents{sink: NewEventSink(client, host, log)}
}

// Run posts the queued Events until ctx ends.
func (p *PolicyEvents) Run(ctx context.Context) { p.sink.Run(ctx) }

// Policy queues an Event about NetworkPolicy namespace/name (never
// blocks: a full queue drops it, logged).
func (p *PolicyEvents) Policy(namespace, name string, uid types.UID, typ, reason, message string) {
	if p == nil {
		return
	}
	p.post(namespace, corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1",
		Namespace: namespace, Name: name, UID: uid}, typ, reason, message)
}

// post queues an Event in namespace about the policy obj, named by
// PolicyEventName (one Event per cluster).
func (p *PolicyEvents) post(namespace string, obj corev1.ObjectReference, typ, reason, message string) {
	now := metav1.NewTime(time.Now())
	p.sink.send(&corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: PolicyEventName(obj.Name, obj.UID, reason, message), Namespace: namespace},
		InvolvedObject: obj,
		Reason:         reason,
		Message:        message,
		Type:           typ,
		Source:         corev1.EventSource{Component: "podnet-routed", Host: p.sink.host},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	})
}

// PolicyEventName is the name every node gives the Event about policy
// name (its UID) with reason and message: "<name>.podnet-<reason>-<hash>",
// a valid object name whatever the policy's name.
func PolicyEventName(name string, uid types.UID, reason, message string) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%s", uid, reason, message)
	suffix := fmt.Sprintf(".podnet-%s-%016x", strings.ToLower(reason), h.Sum64())
	if max := 253 - len(suffix); len(name) > max {
		name = strings.TrimRight(name[:max], ".-")
	}
	return name + suffix
}
