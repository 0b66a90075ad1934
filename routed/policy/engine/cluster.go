// The cluster tier: ClusterNetworkPolicies (policy.networking.k8s.io
// v1beta1, a CRD a cluster may not have) and the Nodes their nodes peers
// select, watched while the API server serves the resource.
//
// The engine asks discovery whether clusternetworkpolicies are served at
// start (and waits for that answer, as it waits for the Pod list), then
// every Config.ClusterPolicyPoll. While they are, it runs an informer on
// them and hears the Nodes (labels and addresses) from
// ListWatches.NodeInformer, podnet-routed's daemon's informer (one watch
// on Nodes), or runs one of its own on ListWatches.Nodes; when they stop
// being served (the CRD deleted: its objects went with it) it stops both
// and forgets what they gave the State; when they come back it starts
// anew. A cluster without the CRD costs the engine one discovery
// request per poll and no watch. When the resource is served at start,
// the first write (and so every ADD wait) comes after both informers have
// synced: a new pod is under its admin policies from its first packet.
//
// Each start is a generation: the handlers of an informer stopped (or
// being stopped) find their generation gone, under e.mu, and change
// nothing, so no event of an old informer lands after its teardown.

package engine

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/routed/policy"
)

// ClusterEvents posts Kubernetes Events about ClusterNetworkPolicies
// (kube.PolicyEvents: one per cluster, whichever node posts first).
type ClusterEvents interface {
	ClusterPolicy(name string, uid types.UID, typ, reason, message string)
}

// clusterTier is the state of the cluster tier's informers; the engine's
// mu guards it.
type clusterTier struct {
	// gen is the current generation (bumped by every start and stop);
	// running: the informers of gen run; cancel stops them
	gen     uint64
	running bool
	cancel  context.CancelFunc
	// nodeReg is the engine's handler on ListWatches.NodeInformer
	nodeReg cache.ResourceEventHandlerRegistration
	// uids are the ClusterNetworkPolicies in the State (name -> UID, for
	// their Events), nodes the Nodes
	uids  map[string]types.UID
	nodes map[string]bool
	// refused are the refusals last reported (name -> text)
	refused map[string]string
}

// startCluster asks discovery whether ClusterNetworkPolicies are served,
// starts the cluster tier's informers if they are, and the poll that
// follows the resource from then on. The InformerSynced it returns (nil:
// nothing to wait for) is what the first write waits for.
//
// It asks until discovery answers, as the first write waits for the
// other lists; but once those have come (coreSynced), a discovery that
// still fails is no outage: the engine starts without the cluster tier
// rather than never (the poll keeps asking).
func (e *Engine) startCluster(ctx context.Context, coreSynced func() bool) (cache.InformerSynced, error) {
	if e.lw.ClusterPolicies == nil {
		return nil, nil
	}
	served := e.lw.ClusterPoliciesServed
	if served == nil {
		served = func(context.Context) (bool, error) { return true, nil }
	}
	var synced cache.InformerSynced
	for {
		ok, err := served(ctx)
		if err == nil {
			if ok {
				if synced, err = e.startClusterInformers(ctx); err != nil {
					return nil, err
				}
			} else {
				e.log.Info("the API server serves no ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1): none enforced until it does")
			}
			break
		}
		if coreSynced() {
			e.log.Error("cannot tell whether the API server serves ClusterNetworkPolicies, though it answers lists: none enforced until it says; asking again every poll", "err", err)
			break
		}
		e.log.Warn("cannot tell whether the API server serves ClusterNetworkPolicies; asking again", "err", err)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(time.Second):
		}
	}
	go e.pollCluster(ctx, served)
	return synced, nil
}

// pollCluster follows whether ClusterNetworkPolicies are served: it
// starts the cluster tier's informers when they come and stops them when
// they go. An unanswered poll changes nothing.
func (e *Engine) pollCluster(ctx context.Context, served func(context.Context) (bool, error)) {
	t := time.NewTicker(e.cfg.ClusterPolicyPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok, err := served(ctx)
		if err != nil {
			e.log.Debug("cannot tell whether the API server serves ClusterNetworkPolicies", "err", err)
			continue
		}
		e.mu.Lock()
		running := e.cluster.running
		e.mu.Unlock()
		switch {
		case ok && !running:
			e.log.Info("the API server serves ClusterNetworkPolicies now: watching them")
			if _, err := e.startClusterInformers(ctx); err != nil {
				e.log.Error("cannot watch ClusterNetworkPolicies", "err", err)
			}
		case !ok && running:
			e.log.Info("the API server no longer serves ClusterNetworkPolicies (CRD deleted): none enforced until it does again")
			e.stopClusterInformers()
		}
	}
}

// startClusterInformers starts a new generation of the ClusterNetworkPolicy
// informer and (with lw.Nodes) the Node informer. The InformerSynced it
// returns says they have synced, or that this generation was stopped
// meanwhile (nothing left to wait for).
func (e *Engine) startClusterInformers(ctx context.Context) (cache.InformerSynced, error) {
	cctx, cancel := context.WithCancel(ctx)
	e.mu.Lock()
	e.cluster.gen++
	gen := e.cluster.gen
	e.cluster.running, e.cluster.cancel = true, cancel
	e.m.ClusterWatching.Set(1)
	e.mu.Unlock()

	cnpInf := cache.NewSharedIndexInformer(e.lw.ClusterPolicies, &cnpv1.ClusterNetworkPolicy{}, 0, cache.Indexers{})
	infs := []cache.SharedIndexInformer{cnpInf}
	handlers := []cache.ResourceEventHandlerFuncs{{
		AddFunc:    func(o any) { e.onClusterPolicy(gen, o) },
		UpdateFunc: func(old, o any) { e.onClusterPolicyUpdate(gen, old, o) },
		DeleteFunc: func(o any) { e.onClusterPolicyDelete(gen, o) },
	}}
	nodeHandler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { e.onNode(gen, o) },
		// a Node update that changes neither labels nor addresses (a
		// status heartbeat) leaves the State as it was: SetNode says so
		UpdateFunc: func(_, o any) { e.onNode(gen, o) },
		DeleteFunc: func(o any) { e.onNodeDelete(gen, o) },
	}
	var synced []cache.InformerSynced
	switch {
	case e.lw.NodeInformer != nil:
		reg, err := e.lw.NodeInformer.AddEventHandler(nodeHandler)
		if err != nil {
			e.stopClusterInformers()
			return nil, fmt.Errorf("node informer handler: %w", err)
		}
		e.mu.Lock()
		e.cluster.nodeReg = reg
		e.mu.Unlock()
		synced = append(synced, reg.HasSynced)
	case e.lw.Nodes != nil:
		infs = append(infs, cache.NewSharedIndexInformer(e.lw.Nodes, &corev1.Node{}, 0, cache.Indexers{}))
		handlers = append(handlers, nodeHandler)
	}
	for i, inf := range infs {
		if err := inf.SetTransform(stripCluster); err != nil {
			e.stopClusterInformers()
			return nil, fmt.Errorf("cluster tier informer: %w", err)
		}
		if _, err := inf.AddEventHandler(handlers[i]); err != nil {
			e.stopClusterInformers()
			return nil, fmt.Errorf("cluster tier informer handler: %w", err)
		}
	}
	for _, inf := range infs {
		go inf.Run(cctx.Done())
		synced = append(synced, inf.HasSynced)
	}
	return func() bool {
		e.mu.Lock()
		stale := e.cluster.gen != gen
		e.mu.Unlock()
		for _, ok := range synced {
			if !stale && !ok() {
				return false
			}
		}
		return true
	}, nil
}

// stopClusterInformers stops the running generation and takes out of the
// State every ClusterNetworkPolicy and Node it gave.
func (e *Engine) stopClusterInformers() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cluster.gen++
	e.cluster.running = false
	if e.cluster.cancel != nil {
		e.cluster.cancel()
		e.cluster.cancel = nil
	}
	if e.cluster.nodeReg != nil {
		if err := e.lw.NodeInformer.RemoveEventHandler(e.cluster.nodeReg); err != nil {
			e.log.Debug("removing the engine's Node handler", "err", err)
		}
		e.cluster.nodeReg = nil
	}
	e.m.ClusterWatching.Set(0)
	for name := range e.cluster.uids {
		e.inc.DeleteClusterPolicy(name)
		e.policiesChanged = true
	}
	for name := range e.cluster.nodes {
		e.inc.DeleteNode(name)
	}
	clear(e.cluster.uids)
	clear(e.cluster.nodes)
	e.changedLocked()
}

// clusterChange runs f under the lock when gen is the current generation.
func (e *Engine) clusterChange(gen uint64, f func() bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if gen == e.cluster.gen && f() {
		e.changedLocked()
	}
}

func (e *Engine) onClusterPolicy(gen uint64, obj any) {
	c, ok := obj.(*cnpv1.ClusterNetworkPolicy)
	if !ok {
		return
	}
	e.clusterChange(gen, func() bool {
		// a policy refused in part is kept (it fails closed); sync's
		// report says why, once
		_ = e.inc.SetClusterPolicy(c)
		e.policiesChanged = true
		e.cluster.uids[c.Name] = c.UID
		return true
	})
}

// onClusterPolicyUpdate skips the updates that leave spec and UID as they
// were (status conditions, labels): they cost no compile.
func (e *Engine) onClusterPolicyUpdate(gen uint64, old, obj any) {
	o, ok1 := old.(*cnpv1.ClusterNetworkPolicy)
	n, ok2 := obj.(*cnpv1.ClusterNetworkPolicy)
	if ok1 && ok2 && o.UID == n.UID && reflect.DeepEqual(o.Spec, n.Spec) {
		return
	}
	e.onClusterPolicy(gen, obj)
}

func (e *Engine) onClusterPolicyDelete(gen uint64, obj any) {
	name, ok := clusterName(obj)
	if !ok {
		return
	}
	e.clusterChange(gen, func() bool {
		e.inc.DeleteClusterPolicy(name)
		e.policiesChanged = true
		delete(e.cluster.uids, name)
		return true
	})
}

// nodeFields is a Node as another informer keeps it (podnet-routed's
// daemon keeps a desired.Record): its name, labels and the addresses of
// its status.addresses.
type nodeFields interface {
	NodeFields() (name string, labels map[string]string, addresses []string)
}

func (e *Engine) onNode(gen uint64, obj any) {
	var n policy.Node
	switch o := obj.(type) {
	case *corev1.Node:
		n = policy.FromNode(o)
	case nodeFields:
		n = policy.NodeOf(o.NodeFields())
	default:
		return
	}
	e.clusterChange(gen, func() bool {
		e.cluster.nodes[n.Name] = true
		return e.inc.SetNode(n)
	})
}

func (e *Engine) onNodeDelete(gen uint64, obj any) {
	name, ok := clusterName(obj)
	if !ok {
		return
	}
	e.clusterChange(gen, func() bool {
		delete(e.cluster.nodes, name)
		return e.inc.DeleteNode(name)
	})
}

// clusterName is the name of a deleted cluster-scoped object, tombstones
// too.
func clusterName(obj any) (string, bool) {
	switch o := obj.(type) {
	case cache.DeletedFinalStateUnknown:
		_, name, err := cache.SplitMetaNamespaceKey(o.Key)
		return name, err == nil
	case *cnpv1.ClusterNetworkPolicy:
		return o.Name, true
	case *corev1.Node:
		return o.Name, true
	case nodeFields:
		name, _, _ := o.NodeFields()
		return name, true
	}
	return "", false
}

// clusterPolicyUIDLocked is the UID of ClusterNetworkPolicy name while
// the State holds it. Callers hold e.mu.
func (e *Engine) clusterPolicyUIDLocked(name string) (types.UID, bool) {
	uid, ok := e.cluster.uids[name]
	return uid, ok
}

// waitSynced waits until every informer of synced has synced (false: ctx
// ended first), and says every 30 seconds which have not: a list that
// keeps failing (RBAC without list and watch of clusternetworkpolicies,
// say) holds the first write, and so every pod's ADD, back.
func (e *Engine) waitSynced(ctx context.Context, synced map[string]cache.InformerSynced) bool {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	start := e.now()
	said := start
	for {
		var waiting []string
		for name, ok := range synced {
			if !ok() {
				waiting = append(waiting, name)
			}
		}
		if len(waiting) == 0 {
			return true
		}
		if e.now().Sub(said) >= 30*time.Second {
			slices.Sort(waiting)
			e.log.Warn("still waiting for the informers' lists: no policy written and no pod's ADD answered until they come (does podnet-routed's RBAC allow list and watch of them?)",
				"waiting", waiting, "for", e.now().Sub(start).Round(time.Second))
			said = e.now()
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
