// br_netfilter: podnet-bridge's same-node traffic reaches the inet hooks
// only with it on.

package engine

import (
	"github.com/podnet/podnet/internal/sysctl"
	corev1 "k8s.io/api/core/v1"
)

// bridgeNetfilter keeps bridged IPv4 and IPv6 traffic going through the
// inet hooks (kubeadm's preflight wants the same settings).
//
// Where they cannot be turned on (no br_netfilter module, a read-only
// /proc/sys), bridged traffic would skip the policy table: the engine then
// fails closed, the bridge table drops IP between two pod ports
// (Ruleset.BridgeUnfiltered), the podnet_policy_bridge_unfiltered gauge is
// 1, and the node gets a Warning Event. Traffic through the node (to other
// nodes, to the node itself) is routed and still judged.
func (e *Engine) bridgeNetfilter() {
	w := sysctl.Writer{Root: e.cfg.ProcSys, Log: e.log}
	changed, failed := w.Set([]sysctl.Setting{
		{Name: "net/bridge/bridge-nf-call-iptables", Value: "1"},
		{Name: "net/bridge/bridge-nf-call-ip6tables", Value: "1"},
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(changed) > 0 && e.sysctlsSet {
		e.m.Repairs.Add(float64(len(changed))) // someone turned them off
	}
	e.sysctlsSet = true
	off := len(failed) > 0
	if off == e.bridgeOff {
		return
	}
	e.bridgeOff = off
	e.m.BridgeUnfiltered.Set(map[bool]float64{false: 0, true: 1}[off])
	e.changedLocked()
	if !off {
		e.log.Info("bridge netfilter is on again: bridged pod traffic is judged by policy again")
		return
	}
	e.log.Error("cannot turn bridge netfilter on (is br_netfilter loaded?): IP between podnet-bridge pods of this node is dropped until it is", "err", failed[0])
	if e.cfg.NodeEvent != nil {
		e.cfg.NodeEvent(corev1.EventTypeWarning, EventBridgeUnfiltered,
			"bridge netfilter (br_netfilter, net.bridge.bridge-nf-call-iptables/ip6tables) cannot be turned on: IP traffic between podnet-bridge pods of this node is dropped, since NetworkPolicy could not judge it: "+failed[0].Error())
	}
}
