// The Node informer: the daemon's view of the cluster's Nodes, trimmed
// to what routing reads, and each change of one kicks the loop.

package daemon

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
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
		// the store keeps each Node as routing reads it, parsed
		// (desired.Record: a few hundred bytes per Node instead of the
		// object), with the labels and addresses when asked
		transform := desired.Transform(d.nodeLabels)
		if err := inf.SetTransform(func(obj any) (any, error) {
			d.watchEvent()
			return transform(obj)
		}); err != nil {
			d.nodeInfErr = fmt.Errorf("node informer transform: %w", err)
			return
		}
		d.nodeInf = inf
	})
	return d.nodeInf, d.nodeInfErr
}

// nodeStore is the Node informer's store: every Node's desired.Record.
type nodeStore struct{ cache.Indexer }

// list is every Node.
func (s nodeStore) list() []*desired.Record {
	objs := s.List()
	out := make([]*desired.Record, 0, len(objs))
	for _, o := range objs {
		if r, ok := o.(*desired.Record); ok {
			out = append(out, r)
		}
	}
	return out
}

// get is Node name (nil: there is none).
func (s nodeStore) get(name string) (*desired.Record, error) {
	obj, ok, err := s.GetByKey(name)
	if err != nil || !ok {
		return nil, err
	}
	r, _ := obj.(*desired.Record)
	return r, nil
}

// exists tells whether the store holds Node name.
func (s nodeStore) exists(name string) bool {
	r, err := s.get(name)
	return err == nil && r != nil
}

// syncNodes starts the Node informer and waits until it has synced (the
// error is ctx's when it ended first). Every Node change routing reads kicks the
// loop (nodeChanged); every list and watch event is contact with the
// API server.
func (d *Daemon) syncNodes(ctx context.Context) (nodeStore, error) {
	informer, err := d.NodeInformer()
	if err != nil {
		return nodeStore{}, err
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: d.nodeChanged,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*desired.Record)
			c, ok2 := cur.(*desired.Record)
			if ok1 && ok2 && o.Node.Equal(c.Node) {
				return // nothing routing reads changed (a status heartbeat)
			}
			d.nodeChanged(cur)
		},
		DeleteFunc: d.nodeChanged,
	}); err != nil {
		return nodeStore{}, fmt.Errorf("node event handler: %w", err)
	}
	go informer.Run(ctx.Done())
	d.log.Info("waiting for the node informer to sync")
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nodeStore{}, ctx.Err()
	}
	d.synced.Store(true)
	d.log.Info("node informer synced")
	return nodeStore{informer.GetIndexer()}, nil
}
