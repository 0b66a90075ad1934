package policy

import (
	"maps"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod is what the engine needs of a Pod. The daemon fills it from the Pod
// informer (FromPod).
type Pod struct {
	Namespace, Name string
	UID             types.UID
	// Node is spec.nodeName: the node that enforces this pod's policy.
	Node   string
	Labels map[string]string
	// IPs are status.podIPs. A pod without IPs (pending, or terminated:
	// FromPod drops the IPs of a Succeeded or Failed pod, since they may
	// already be another pod's) contributes nothing.
	IPs []netip.Addr
	// HostNetwork pods use the node's addresses: they are never a policy's
	// target and contribute no address as a selected peer.
	HostNetwork bool
	// Ports are the containers' named ports, the only ones a policy can
	// name.
	Ports []NamedPort
	// Terminating: the Pod object is being deleted (deletionTimestamp).
	// Created is its creationTimestamp. Both only decide which of two Pod
	// objects claiming one address gets it (see resolveClaims).
	Terminating bool
	Created     time.Time
	// Finished: the pod Succeeded or Failed (it never gets an address
	// again)
	Finished bool
}

// arriving tells whether p is scheduled and has no address yet: its
// sandbox not attached, or its status not reported. A pod of the compiled
// node then gets its chains and its port's elements before its ADD (the
// engine names its port before the link exists), so that the ADD's wait
// adds only its addresses to the table.
func arriving(p *Pod) bool {
	return p != nil && !p.HostNetwork && len(p.IPs) == 0 && p.Node != "" && !p.Finished && !p.Terminating
}

// NamedPort is a container port with a name.
type NamedPort struct {
	Name     string
	Protocol uint8
	Port     uint16
}

// Namespace is what the engine needs of a Namespace.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// Key is "namespace/name".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// protoNumber maps a Kubernetes protocol name to its number; "" is TCP.
func protoNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return ProtoTCP, true
	case corev1.ProtocolUDP:
		return ProtoUDP, true
	case corev1.ProtocolSCTP:
		return ProtoSCTP, true
	}
	return 0, false
}

// FromPod converts an informer's Pod. Pure: it keeps no reference to p.
// Unparseable IPs and ports with an unknown protocol or out of range are
// skipped.
func FromPod(p *corev1.Pod) Pod {
	out := Pod{
		Namespace:   p.Namespace,
		Name:        p.Name,
		UID:         p.UID,
		Node:        p.Spec.NodeName,
		Labels:      maps.Clone(p.Labels),
		HostNetwork: p.Spec.HostNetwork,
		Terminating: p.DeletionTimestamp != nil,
		Created:     p.CreationTimestamp.Time,
	}
	out.Finished = p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	if !out.Finished {
		seen := map[netip.Addr]bool{}
		add := func(s string) {
			a, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil || a.Zone() != "" {
				return
			}
			a = a.Unmap()
			if !seen[a] {
				seen[a] = true
				out.IPs = append(out.IPs, a)
			}
		}
		for _, ip := range p.Status.PodIPs {
			add(ip.IP)
		}
		if len(p.Status.PodIPs) == 0 && p.Status.PodIP != "" {
			add(p.Status.PodIP)
		}
	}
	// Named ports resolve against the containers' ports, as Services'
	// targetPort does; restartable init containers (sidecars) serve too.
	addPorts := func(cs []corev1.Container) {
		for _, c := range cs {
			for _, cp := range c.Ports {
				proto, ok := protoNumber(cp.Protocol)
				if cp.Name == "" || !ok || cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
					continue
				}
				out.Ports = append(out.Ports, NamedPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
			}
		}
	}
	addPorts(p.Spec.Containers)
	addPorts(p.Spec.InitContainers)
	return out
}

// FromNamespace converts an informer's Namespace. Pure.
func FromNamespace(ns *corev1.Namespace) Namespace {
	return Namespace{Name: ns.Name, Labels: maps.Clone(ns.Labels)}
}

// State is the engine's view of the cluster: every pod (of every node: the
// pods of other nodes are peers), namespace and policy. It is not safe for
// concurrent use; the daemon serializes its informer events.
type State struct {
	pods       map[string]*Pod // by namespace/name
	namespaces map[string]*Namespace
	policies   map[string]*parsedPolicy // by namespace/name
	cnps       map[string]*parsedCNP    // ClusterNetworkPolicies by name
	nodes      map[string]*Node
	// holders: which pod (namespace/name) holds each address of this
	// node, by the node's own records (SetHolders).
	holders map[netip.Addr]string
	// ports: this node's host-side pod interfaces by pod (SetLocalPorts).
	ports map[string][]LocalPort
	// ix is the index of the current objects, built on demand, dropped
	// by every change.
	ix *index
}

// NewState returns an empty State.
func NewState() *State {
	return &State{
		pods:       map[string]*Pod{},
		namespaces: map[string]*Namespace{},
		policies:   map[string]*parsedPolicy{},
		cnps:       map[string]*parsedCNP{},
		nodes:      map[string]*Node{},
	}
}

// Snapshot is a copy of s that later changes of s leave alone (its maps
// are copied; the objects in them are never changed in place), for a
// whole compile beside the changes.
func (s *State) Snapshot() *State {
	return &State{
		pods: maps.Clone(s.pods), namespaces: maps.Clone(s.namespaces), policies: maps.Clone(s.policies),
		cnps: maps.Clone(s.cnps), nodes: maps.Clone(s.nodes), holders: maps.Clone(s.holders), ports: maps.Clone(s.ports),
	}
}

// SetPod adds or replaces a pod (by namespace/name).
//
// It reports whether a Ruleset can change: Compile and Explain see only
// pods with an address that are not hostNetwork, so a pod that is not one
// of those before and after the change (a pod created before it has an
// address, as every pod is) changes none.
func (s *State) SetPod(p Pod) bool {
	p.IPs = cleanIPs(p.IPs)
	old := s.pods[p.Key()]
	s.pods[p.Key()] = &p
	if !indexed(old) && !indexed(&p) {
		return false
	}
	s.ix = nil
	return true
}

// DeletePod removes a pod. It reports whether a Ruleset can change (see
// SetPod).
func (s *State) DeletePod(namespace, name string) bool {
	key := namespace + "/" + name
	old := s.pods[key]
	delete(s.pods, key)
	if !indexed(old) {
		return false
	}
	s.ix = nil
	return true
}

// seen says whether pod p claims addresses: Compile and Explain see
// them.
func seen(p *Pod) bool { return p != nil && !p.HostNetwork && len(p.IPs) > 0 }

// indexed says whether the index holds pod p: seen, or arriving.
func indexed(p *Pod) bool { return seen(p) || arriving(p) }

// SetNamespace adds or replaces a namespace.
func (s *State) SetNamespace(ns Namespace) {
	s.ix = nil
	if ns.Labels[corev1.LabelMetadataName] != ns.Name {
		// the API server sets it on every namespace; a namespace
		// selector may use it
		ns.Labels = maps.Clone(ns.Labels)
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels[corev1.LabelMetadataName] = ns.Name
	}
	s.namespaces[ns.Name] = &ns
}

// DeleteNamespace removes a namespace.
func (s *State) DeleteNamespace(name string) {
	s.ix = nil
	delete(s.namespaces, name)
}

// SetPolicy adds or replaces a policy. It returns a non-nil error when the
// policy is refused (invalid: the API server validates, the engine does not
// trust it): the error says why, for a log line and an Event. A refused
// policy still isolates the pods its podSelector selects (when the
// selector parses) in the directions of its policyTypes, and allows
// nothing: it fails closed, alone, and every other policy is unaffected.
func (s *State) SetPolicy(np *networkingv1.NetworkPolicy) error {
	s.ix = nil
	pp := parsePolicy(np)
	s.policies[np.Namespace+"/"+np.Name] = pp
	if pp.err != nil {
		return pp.err
	}
	return nil
}

// DeletePolicy removes a policy.
func (s *State) DeletePolicy(namespace, name string) {
	s.ix = nil
	delete(s.policies, namespace+"/"+name)
}

// Refused lists the refused policies ("namespace/name") and why.
func (s *State) Refused() map[string]error {
	out := map[string]error{}
	for k, p := range s.policies {
		if p.err != nil {
			out[k] = p.err
		}
	}
	return out
}

// cleanIPs unmaps, drops invalid and duplicate addresses.
func cleanIPs(ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range ips {
		if !a.IsValid() {
			continue
		}
		a = a.Unmap().WithZone("")
		dup := false
		for _, b := range out {
			dup = dup || a == b
		}
		if !dup {
			out = append(out, a)
		}
	}
	return out
}

// nsLabels are a namespace's labels; a namespace the informer has not
// delivered yet has the one label the API server puts on every namespace.
func (s *State) nsLabels(name string) map[string]string {
	if ns, ok := s.namespaces[name]; ok {
		return ns.Labels
	}
	return map[string]string{corev1.LabelMetadataName: name}
}
