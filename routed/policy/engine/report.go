// What the engine says about the policies: address clashes and refused
// policies, in the log and as Events on the NetworkPolicy objects.

package engine

import (
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/podnet/podnet/routed/policy"
)

// reportClashes logs each address two Pod objects claim once (and again
// when who gets it changes), and keeps the gauge.
func (e *Engine) reportClashes(clashes []policy.Clash) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := make(map[netip.Addr]string, len(clashes))
	for _, c := range clashes {
		by := "the rule every node applies (not terminating, then newer, then namespace/name)"
		if c.ByHolder {
			by = "this node's IPAM record of the pod that holds it"
		}
		text := fmt.Sprintf("%v -> %s by %s", c.Pods, c.Winner, by)
		now[c.Addr] = text
		if e.clashes[c.Addr] != text {
			e.log.Warn("two or more Pod objects claim one address: it gets the policy of one of them", "address", c.Addr, "pods", c.Pods, "winner", c.Winner, "decidedBy", by)
		}
	}
	e.clashes = now
	e.m.AddressClashes.Set(float64(len(now)))
}

// report says each newly refused policy once (a log line and, with
// cfg.Events, a Warning Event on it), and once again when it is accepted;
// it keeps the gauge.
func (e *Engine) report(refused map[string]error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := map[string]string{}
	for k, err := range refused {
		now[k] = err.Error()
		if e.refused[k] != now[k] {
			e.log.Warn("NetworkPolicy refused: it isolates the pods it selects and allows nothing until fixed", "policy", k, "reason", err)
			why := now[k]
			if pe, ok := errors.AsType[*policy.PolicyError](err); ok {
				why = pe.Field + ": " + pe.Reason
			}
			e.policyEvent(k, corev1.EventTypeWarning, EventPolicyRefused,
				"podnet refuses this NetworkPolicy: "+why+"; it isolates the pods it selects and allows them nothing until it is fixed")
		}
	}
	for k := range e.refused {
		if _, still := now[k]; !still {
			e.log.Info("NetworkPolicy accepted again", "policy", k)
			e.policyEvent(k, corev1.EventTypeNormal, EventPolicyAccepted, "podnet enforces this NetworkPolicy again")
		}
	}
	e.refused = now
	e.m.Refused.Set(float64(len(now)))
}

// policyEvent posts an Event about the policy of key (namespace/name)
// when it still exists.
func (e *Engine) policyEvent(key, typ, reason, msg string) {
	if e.cfg.Events == nil || e.polInf == nil {
		return
	}
	obj, ok, _ := e.polInf.GetStore().GetByKey(key)
	np, isPolicy := obj.(*networkingv1.NetworkPolicy)
	if !ok || !isPolicy {
		return // deleted: nothing to say about it
	}
	e.cfg.Events.Policy(np.Namespace, np.Name, np.UID, typ, reason, msg)
}

// reportClusterRefused says each ClusterNetworkPolicy newly refused in
// part once (a log line and, with cfg.ClusterEvents, a Warning Event on
// it), and once again when it is accepted whole; it keeps the gauge. A
// policy deleted (or gone with its CRD) gets nothing more.
//
// One Event per cluster: every node refuses a ClusterNetworkPolicy in the
// same words (the parse reads the object alone), and kube.PolicyEvents
// names the Event after the policy's UID, the reason and the message, so
// the first node's post creates it and the others' find it there
// (AlreadyExists), as for NetworkPolicies: no leader to elect, and no
// Event lost while the node that would be the leader is down.
func (e *Engine) reportClusterRefused(refused map[string]error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := map[string]string{}
	for name, err := range refused {
		now[name] = err.Error()
		if e.cluster.refused[name] == now[name] {
			continue
		}
		e.log.Warn("ClusterNetworkPolicy refused in part: what could not be read fails closed until fixed", "policy", name, "reason", err)
		why := now[name]
		if ce, ok := errors.AsType[*policy.ClusterPolicyError](err); ok {
			why = ce.Field + ": " + ce.Reason + " (" + ce.Effect + ")"
		}
		e.clusterEventLocked(name, corev1.EventTypeWarning, EventPolicyRefused,
			"podnet refuses this ClusterNetworkPolicy in part: "+why+"; the rest of it is enforced")
	}
	for name := range e.cluster.refused {
		if _, still := now[name]; still {
			continue
		}
		if _, held := e.clusterPolicyUIDLocked(name); held {
			e.log.Info("ClusterNetworkPolicy accepted whole again", "policy", name)
			e.clusterEventLocked(name, corev1.EventTypeNormal, EventPolicyAccepted, "podnet enforces this ClusterNetworkPolicy whole again")
		}
	}
	e.cluster.refused = now
	e.m.ClusterRefused.Set(float64(len(now)))
}

// clusterEventLocked posts an Event about ClusterNetworkPolicy name while
// the State holds it. Callers hold e.mu.
func (e *Engine) clusterEventLocked(name, typ, reason, msg string) {
	uid, held := e.clusterPolicyUIDLocked(name)
	if e.cfg.ClusterEvents == nil || !held {
		return
	}
	e.cfg.ClusterEvents.ClusterPolicy(name, uid, typ, reason, msg)
}
