// Package kube is podnet-routed's Kubernetes client side: REST clients
// of one API group each (protobuf where it pays), the list-watches the
// daemon's and the NetworkPolicy engine's informers run on, and the
// queue that posts their Events without ever making them wait.
package kube

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// CoreClient is a REST client of core/v1 and nothing else, in protobuf:
// the typed clientset and informer factory would link every API group
// into the binary (its pages are most of the daemon's resident memory),
// and JSON costs several times the CPU and garbage to decode a large
// Node list.
func CoreClient(cfg *rest.Config) (rest.Interface, error) {
	return restClient(cfg, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, true)
}

// restClient is a REST client of one API group version, its scheme alone.
func restClient(cfg *rest.Config, apiPath string, gv schema.GroupVersion, addToScheme func(*runtime.Scheme) error, protobuf bool) (rest.Interface, error) {
	scheme := runtime.NewScheme()
	if err := addToScheme(scheme); err != nil {
		return nil, fmt.Errorf("%s scheme: %w", gv, err)
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = apiPath
	c.GroupVersion = &gv
	if protobuf {
		c.ContentType = runtime.ContentTypeProtobuf
		c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = "podnet-routed"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return rc, nil
}

// NodesListWatch lists and watches the cluster's Nodes through core.
func NodesListWatch(core rest.Interface) cache.ListerWatcher {
	return cache.NewListWatchFromClient(core, "nodes", metav1.NamespaceAll, fields.Everything())
}

// APIServerAddrs are the addresses of the API server as cfg names it: its
// host when an address, or what the name resolves to (best effort: a
// name that does not resolve yields none).
func APIServerAddrs(ctx context.Context, cfg *rest.Config) []netip.Addr {
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		u = &url.URL{Host: cfg.Host}
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs
}

// ServiceCIDRsListWatch lists and watches ServiceCIDR objects
// (networking.k8s.io/v1), the cluster's service ranges.
func ServiceCIDRsListWatch(cfg *rest.Config) (cache.ListerWatcher, error) {
	rc, err := restClient(cfg, "/apis", networkingv1.SchemeGroupVersion, networkingv1.AddToScheme, false)
	if err != nil {
		return nil, err
	}
	return cache.NewListWatchFromClient(rc, "servicecidrs", metav1.NamespaceAll, fields.Everything()), nil
}

// PolicyListWatches are the sources of the NetworkPolicy engine's
// informers: every Pod and Namespace (core, protobuf) and every
// NetworkPolicy (networking.k8s.io/v1), one watch each.
func PolicyListWatches(cfg *rest.Config, core rest.Interface) (pods, namespaces, policies cache.ListerWatcher, err error) {
	rc, err := restClient(cfg, "/apis", networkingv1.SchemeGroupVersion, networkingv1.AddToScheme, true)
	if err != nil {
		return nil, nil, nil, err
	}
	return cache.NewListWatchFromClient(core, "pods", metav1.NamespaceAll, fields.Everything()),
		cache.NewListWatchFromClient(core, "namespaces", metav1.NamespaceAll, fields.Everything()),
		cache.NewListWatchFromClient(rc, "networkpolicies", metav1.NamespaceAll, fields.Everything()), nil
}
