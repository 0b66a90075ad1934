package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// watchEvent records a Node list or watch event: the API server answered.
func (d *Daemon) watchEvent() {
	d.lastEvent.Store(time.Now().UnixNano())
	d.contact()
}

// contact records that the API server answered.
func (d *Daemon) contact() {
	d.lastContact.Store(time.Now().UnixNano())
	if since := d.unreachableSince.Swap(0); since != 0 {
		d.log.Info("API server reachable again", "after", time.Since(time.Unix(0, since)).Round(time.Second).String())
	}
}

// unreachable records that the API server did not answer.
func (d *Daemon) unreachable(err error) {
	if d.unreachableSince.CompareAndSwap(0, time.Now().UnixNano()) {
		d.log.Warn("API server unreachable; routes stay in place", "err", err)
	}
}

// contactAge is the seconds since the last Node list or watch event.
func (d *Daemon) contactAge() float64 {
	last := d.lastEvent.Load()
	if last == 0 {
		return 0
	}
	return time.Since(time.Unix(0, last)).Seconds()
}

// probeAPI asks the API server for /version whenever nothing was heard of
// it for a third of --apiserver-timeout: a Node watch that has nothing
// to say and one whose server is gone look alike (client-go retries a
// refused watch on its own, silently), and a quiet cluster must not look
// unreachable, nor a dead API server reachable. A busy cluster's watch
// events make the probe unnecessary, so it costs nothing at scale.
func (d *Daemon) probeAPI(ctx context.Context, core rest.Interface) {
	every := min(max(d.cfg.APIServerTimeout/3, time.Second), 20*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if last := d.lastContact.Load(); last != 0 && time.Since(time.Unix(0, last)) < every {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		err := core.Get().AbsPath("/version").Do(pctx).Error()
		cancel()
		var answered apierrors.APIStatus
		switch {
		case err == nil, errors.As(err, &answered):
			d.contact() // an answer, even a refusal, is contact
		case ctx.Err() == nil:
			d.unreachable(err)
		}
	}
}

// unreachableFor is the seconds since the API server's lists and watches
// began to fail (0 while they work).
func (d *Daemon) unreachableFor() float64 {
	since := d.unreachableSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since)).Seconds()
}

// watchServiceCIDRs keeps the service ranges of the ServiceCIDR objects
// (added to --service-cidr) current. Where they cannot be read (an API
// server older than v1.33, or no RBAC for them) the flag alone counts;
// that is said once. A change applies everything again.
func (d *Daemon) watchServiceCIDRs(ctx context.Context) error {
	if d.serviceCIDRsLW == nil {
		return nil
	}
	if _, err := d.serviceCIDRsLW.List(metav1.ListOptions{Limit: 1}); err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
			d.log.Warn("cannot read ServiceCIDR objects: only --service-cidr is kept out of PodCIDRs", "serviceCIDRs", d.cfg.ServiceCIDRs, "err", err)
			return nil
		}
		d.log.Warn("cannot list ServiceCIDR objects yet; watching them anyway", "err", err)
	}
	inf := cache.NewSharedIndexInformer(d.serviceCIDRsLW, &networkingv1.ServiceCIDR{}, 0, cache.Indexers{})
	update := func(any) {
		var cidrs []string
		for _, o := range inf.GetStore().List() {
			if sc, ok := o.(*networkingv1.ServiceCIDR); ok {
				cidrs = append(cidrs, sc.Spec.CIDRs...)
			}
		}
		out, ignored := serviceRanges(cidrs, d.cfg.ClusterCIDRs)
		for _, c := range ignored {
			d.log.Warn("ServiceCIDR ignored: it would refuse every Node", "cidr", c, "clusterCIDRs", d.cfg.ClusterCIDRs)
		}
		d.svcMu.Lock()
		changed := !slices.Equal(out, d.svcFromAPI)
		d.svcFromAPI = out
		d.svcMu.Unlock()
		if changed {
			d.log.Info("service CIDRs", "fromAPI", out, "fromFlag", d.cfg.ServiceCIDRs)
			d.trigger(reasonServiceCIDRs)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: update, UpdateFunc: func(_, o any) { update(o) }, DeleteFunc: update}); err != nil {
		return fmt.Errorf("servicecidr event handler: %w", err)
	}
	go inf.Run(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	return nil
}

// serviceRanges are the service ranges of the ServiceCIDR objects' cidrs,
// sorted. A value that does not parse, a default route, or one that holds
// a whole cluster CIDR (one object would then refuse every Node and take
// the pod network off every node) is left out and returned in ignored.
func serviceRanges(cidrs []string, cluster []netip.Prefix) (out []netip.Prefix, ignored []string) {
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p.Bits() == 0 || slices.ContainsFunc(cluster, func(cc netip.Prefix) bool {
			return p.Bits() <= cc.Bits() && p.Contains(cc.Addr())
		}) {
			ignored = append(ignored, c)
			continue
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out, ignored
}

// serviceCIDRs are the service ranges: the flag's and the API's.
func (d *Daemon) serviceCIDRs() []netip.Prefix {
	d.svcMu.Lock()
	defer d.svcMu.Unlock()
	return append(slices.Clone(d.cfg.ServiceCIDRs), d.svcFromAPI...)
}
