// The Node informer: the daemon's view of the cluster's Nodes, trimmed
// to what routing reads, and each change of one kicks the loop.

package daemon

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/routed/desired"
)

// WithNodeLabels makes the Node informer keep the Nodes' labels (for the
// policy engine's nodes peers, which shares the informer: NodeInformer).
// Call it before Run and NodeInformer.
func (d *Daemon) WithNodeLabels() *Daemon {
	d.nodeLabels = true
	return d
}

// NodeInformer is the daemon's Node informer, made on the first call; Run
// runs it. Others (the policy engine) add their handlers to it rather
// than watching Nodes a second time: one watch per resource.
func (d *Daemon) NodeInformer() (cache.SharedIndexInformer, error) {
	d.nodeInfOnce.Do(func() {
		inf := cache.NewSharedIndexInformer(d.nodesLW, &corev1.Node{}, 0, cache.Indexers{})
		// the API server's reachability: every list and watch event is
		// contact, every failed list or watch starts (or continues) an outage
		if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			d.unreachable(err)
		}); err != nil {
			d.nodeInfErr = fmt.Errorf("node watch error handler: %w", err)
			return
		}
		// keep only what FromNode reads (and the labels, when asked): the
		// informer's store then holds a few hundred bytes per Node
		// instead of the whole object (managedFields, images, conditions)
		if err := inf.SetTransform(func(obj any) (any, error) {
			d.watchEvent()
			slim, err := desired.SlimNode(obj)
			if n, ok := obj.(*corev1.Node); ok && d.nodeLabels && err == nil {
				slim.(*corev1.Node).Labels = n.Labels
			}
			return slim, err
		}); err != nil {
			d.nodeInfErr = fmt.Errorf("node informer transform: %w", err)
			return
		}
		d.nodeInf = inf
	})
	return d.nodeInf, d.nodeInfErr
}

// syncNodes starts the Node informer and waits until it has synced (nil
// lister: ctx ended first). Every Node change routing reads kicks the
// loop (nodeChanged); every list and watch event is contact with the
// API server.
func (d *Daemon) syncNodes(ctx context.Context) (listersv1.NodeLister, error) {
	informer, err := d.NodeInformer()
	if err != nil {
		return nil, err
	}
	lister := listersv1.NewNodeLister(informer.GetIndexer())
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: d.nodeChanged,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && desired.FromNode(o).Equal(desired.FromNode(c)) {
				return // nothing routing reads changed (a status heartbeat)
			}
			d.nodeChanged(cur)
		},
		DeleteFunc: d.nodeChanged,
	}); err != nil {
		return nil, fmt.Errorf("node event handler: %w", err)
	}
	go informer.Run(ctx.Done())
	d.log.Info("waiting for the node informer to sync")
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil, ctx.Err()
	}
	d.synced.Store(true)
	d.log.Info("node informer synced")
	return lister, nil
}
