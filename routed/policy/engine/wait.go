// The plugins' ADD-time wait on the policy socket: the addresses a pod got,
// recorded before its Pod object shows them, and the answer once a write
// that includes them is in the kernel.

package engine

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/podnet/podnet/internal/policysock"
)

// waiter is one ADD-time wait: answered once generation want is in the
// kernel.
type waiter struct {
	want   uint64
	answer func()
}

// handleWait answers a plugin's ADD-time wait: it records the addresses
// the pod got (the Pod object shows them only later) and answers once a
// write that includes them is in the kernel: done sends the answer from
// the write loop's thread right after that write, so the plugin does not
// wait for this goroutine to be scheduled again (on a busy node that was
// up to 5 ms of a wait's 99th percentile).
func (e *Engine) handleWait(ctx context.Context, req policysock.Request, reply func(error)) error {
	start := e.now()
	var once sync.Once
	answer := func() {
		once.Do(func() {
			e.m.WaitSeconds.Observe(e.now().Sub(start).Seconds())
			reply(nil)
		})
	}
	err := e.wait(ctx, req, answer)
	if err == nil {
		answer()
	}
	return err
}

func (e *Engine) wait(ctx context.Context, req policysock.Request, answer func()) error {
	key := req.Namespace + "/" + req.Name
	for {
		e.mu.Lock()
		added := e.podAdded // taken before the look: an add after it closes it
		e.mu.Unlock()
		obj, ok, err := e.podInf.GetStore().GetByKey(key)
		if err != nil {
			return fmt.Errorf("pod %s: %w", key, err)
		}
		if ok {
			pod := obj.(*corev1.Pod)
			if pod.Spec.NodeName != e.cfg.NodeName {
				return fmt.Errorf("pod %s is on node %q, not on %s", key, pod.Spec.NodeName, e.cfg.NodeName)
			}
			break
		}
		// the informer has not seen the pod yet: it is on its way (the
		// kubelet got it from the same API server); the next pod the
		// informer adds wakes this
		select {
		case <-ctx.Done():
			e.mu.Lock()
			e.overrides[key] = override{ips: req.IPs, at: e.now()}
			e.mu.Unlock()
			return fmt.Errorf("pod %s is not known to the API server's watch yet; it stays isolated until it is", key)
		case <-added:
		}
	}
	link, linked := portLink{}, false
	if req.HostVeth != "" {
		link, linked = e.hostVeth(req.HostVeth)
		if linked && req.Guard != nil {
			// the plugin says which kind of port it is: it asks before
			// attaching a podnet-bridge port to its bridge, and a pod
			// judged by a port it does not send through would be open
			link.bridged = req.Guard.Mode == "bridge"
		}
	}
	e.mu.Lock()
	e.overrides[key] = override{ips: req.IPs, at: e.now()}
	// a compile and write only when the wait tells the engine something
	// new: a holder or a port it did not know (every ADD waits here)
	changed := false
	for _, a := range req.IPs {
		a = a.Unmap()
		if e.waitHolders[a] != key {
			e.inc.SetHolder(a, key)
			changed = true
		}
		e.waitHolders[a], e.waitAt[a] = key, e.now()
	}
	if old, known := e.links[req.HostVeth]; linked && (!known || old != link) {
		e.links[req.HostVeth] = link
		e.portsOf[key] = true
		changed = true
	}
	if changed {
		e.changedLocked()
	}
	obj, ok, _ := e.podInf.GetStore().GetByKey(key)
	if ok {
		e.setPodLocked(obj.(*corev1.Pod))
	}
	want := e.gen
	w := &waiter{want: want, answer: answer}
	if e.doneGen < want {
		e.waiters[w] = true
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.waiters, w)
		e.mu.Unlock()
	}()
	return e.await(ctx, key, want)
}

// await returns once generation want is in the kernel, or ctx ends.
func (e *Engine) await(ctx context.Context, key string, want uint64) error {
	for {
		e.mu.Lock()
		done, applied := e.doneGen >= want, e.applied
		e.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s: policy not written in time: %w", key, ctx.Err())
		case <-applied:
		}
	}
}
