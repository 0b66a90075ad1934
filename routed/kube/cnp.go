// ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1, a CRD that a
// cluster may not have): the engine's list-watch and the discovery check
// that says whether the API server serves it.

package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// ClusterPolicyResource is the resource the engine lists and watches.
const ClusterPolicyResource = "clusternetworkpolicies"

// ClusterPolicyListWatch lists and watches ClusterNetworkPolicies through
// a REST client of policy.networking.k8s.io/v1beta1 alone (JSON: a CRD
// serves no protobuf). It links only the API types, which package policy
// links anyway, not the module's typed clientset and informers. served
// asks discovery whether the API server serves the resource (its CRD is
// installed and established): (false, nil) when it does not, an error
// when the API server could not say. Discovery needs no RBAC beyond
// what every authenticated user has.
func ClusterPolicyListWatch(cfg *rest.Config) (lw cache.ListerWatcher, served func(context.Context) (bool, error), err error) {
	rc, err := restClient(cfg, "/apis", cnpv1.SchemeGroupVersion, cnpv1.AddToScheme, false)
	if err != nil {
		return nil, nil, err
	}
	lw = cache.NewListWatchFromClient(rc, ClusterPolicyResource, metav1.NamespaceAll, fields.Everything())
	return lw, func(ctx context.Context) (bool, error) {
		return servesResource(ctx, rc, cnpv1.SchemeGroupVersion.String(), ClusterPolicyResource)
	}, nil
}

// servesResource reads /apis/<groupVersion> and looks for resource.
func servesResource(ctx context.Context, rc rest.Interface, groupVersion, resource string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := rc.Get().AbsPath("/apis", groupVersion).Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovery of %s: %w", groupVersion, err)
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(raw, &list); err != nil {
		return false, fmt.Errorf("discovery of %s: %w", groupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

// ClusterPolicy queues an Event about ClusterNetworkPolicy name (never
// blocks: a full queue drops it, logged). The policy is cluster-scoped:
// the Event goes in namespace default, where kubectl describe finds
// Events of cluster-scoped objects. It is named as a NetworkPolicy's is
// (PolicyEventName: the policy's UID, reason and message), so every
// node's engine, which refuses a ClusterNetworkPolicy for the same reason
// in the same words (the parse reads the object alone, nothing of the
// node), posts the same Event: the first creates it, the others find it
// there, and the cluster gets one.
func (p *PolicyEvents) ClusterPolicy(name string, uid types.UID, typ, reason, message string) {
	if p == nil {
		return
	}
	p.post(metav1.NamespaceDefault, corev1.ObjectReference{Kind: "ClusterNetworkPolicy", APIVersion: cnpv1.SchemeGroupVersion.String(),
		Name: name, UID: uid}, typ, reason, message)
}
