package daemon

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// PolicyEvents posts Events about NetworkPolicies for the policy engine.
// Every node's engine judges a policy the same way, so an Event is named
// after the policy's UID, the reason and the message (PolicyEventName):
// the first node to post creates it, the others find it there
// (AlreadyExists) and add nothing. A cluster gets one Event per refusal,
// not one per node, and no leader is elected for it.
type PolicyEvents struct {
	sink *eventSink
}

// NewPolicyEvents posts through client (core/v1) as podnet-routed on host;
// Run sends.
func NewPolicyEvents(client rest.Interface, host string, log *slog.Logger) *PolicyEvents {
	return &PolicyEvents{sink: newEventSink(client, host, log)}
}

// Run posts the queued Events until ctx ends.
func (p *PolicyEvents) Run(ctx context.Context) { p.sink.run(ctx) }

// Policy queues an Event about NetworkPolicy namespace/name (never
// blocks: a full queue drops it, logged).
func (p *PolicyEvents) Policy(namespace, name string, uid types.UID, typ, reason, message string) {
	if p == nil {
		return
	}
	now := metav1.NewTime(time.Now())
	p.sink.send(&corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyEventName(name, uid, reason, message), Namespace: namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1",
			Namespace: namespace, Name: name, UID: uid},
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
