// The informers' Pod, Namespace and NetworkPolicy changes into the policy
// state, with the addresses plugins reported (override) while a Pod object
// does not show its own yet.

package engine

import (
	"net/netip"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/routed/policy"
)

// override is the addresses a plugin reported for a pod at ADD, and when.
type override struct {
	ips []netip.Addr
	at  time.Time
}

// setPodLocked puts the informer's pod in the state, with the addresses a
// plugin reported while the Pod object does not have its own yet.
func (e *Engine) setPodLocked(obj *corev1.Pod) {
	p := policy.FromPod(obj)
	key := p.Namespace + "/" + p.Name
	if o, ok := e.overrides[key]; ok {
		switch {
		case len(p.IPs) > 0 && sameAddrs(p.IPs, o.ips):
			delete(e.overrides, key) // the Pod object caught up
		case len(p.IPs) == 0 && p.Node == e.cfg.NodeName && e.now().Sub(o.at) < e.cfg.OverrideTTL:
			p.IPs = slices.Clone(o.ips)
		}
	}
	if p.Node == e.cfg.NodeName {
		e.portsOf[key] = true // its port may be known already
	}
	if e.inc.SetPod(p) {
		e.changedLocked()
	}
}

// pruneOverrides forgets reported addresses older than OverrideTTL.
func (e *Engine) pruneOverrides() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, o := range e.overrides {
		if e.now().Sub(o.at) >= e.cfg.OverrideTTL {
			delete(e.overrides, k)
			if obj, ok, _ := e.podInf.GetStore().GetByKey(k); ok {
				e.setPodLocked(obj.(*corev1.Pod))
			}
		}
	}
}

func sameAddrs(a, b []netip.Addr) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Addr.Compare)
	slices.SortFunc(b, netip.Addr.Compare)
	return slices.Equal(a, b)
}

func (e *Engine) onPod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.setPodLocked(pod)
	close(e.podAdded)
	e.podAdded = make(chan struct{})
}

// onPodUpdate skips the updates that change nothing the model reads (most
// of a pod's status updates: conditions, container states), so that they
// cost no compile.
func (e *Engine) onPodUpdate(old, obj any) {
	o, ok1 := old.(*corev1.Pod)
	n, ok2 := obj.(*corev1.Pod)
	if ok1 && ok2 && reflect.DeepEqual(policy.FromPod(o), policy.FromPod(n)) {
		return
	}
	e.onPod(obj)
}

func (e *Engine) onPodDelete(obj any) {
	ns, name, ok := metaOf(obj)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.overrides, ns+"/"+name)
	if e.inc.DeletePod(ns, name) {
		e.changedLocked()
	}
}

func (e *Engine) onNamespace(obj any) {
	if ns, ok := obj.(*corev1.Namespace); ok {
		e.change(func() { e.inc.SetNamespace(policy.FromNamespace(ns)) })
	}
}

func (e *Engine) onNamespaceDelete(obj any) {
	if _, name, ok := metaOf(obj); ok {
		e.change(func() { e.inc.DeleteNamespace(name) })
	}
}

func (e *Engine) onPolicy(obj any) {
	if np, ok := obj.(*networkingv1.NetworkPolicy); ok {
		// a refused policy is kept (it fails closed); report() logs why
		e.change(func() { _ = e.inc.SetPolicy(np); e.policiesChanged = true })
	}
}

func (e *Engine) onPolicyDelete(obj any) {
	if ns, name, ok := metaOf(obj); ok {
		e.change(func() { e.inc.DeletePolicy(ns, name); e.policiesChanged = true })
	}
}

// change applies f to the state under the lock and asks for a compile.
func (e *Engine) change(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f()
	e.changedLocked()
}

// metaOf reads namespace and name of a deleted object, tombstones too.
func metaOf(obj any) (string, string, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		ns, name, err := cache.SplitMetaNamespaceKey(t.Key)
		return ns, name, err == nil
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		return o.Namespace, o.Name, true
	case *corev1.Namespace:
		return "", o.Name, true
	case *networkingv1.NetworkPolicy:
		return o.Namespace, o.Name, true
	}
	return "", "", false
}
