package engine

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// stripPod keeps of a Pod only what the model reads (namespace, name,
// UID, labels, creation and deletion times, node, hostNetwork, containers' ports,
// phase and addresses),
// so that a cluster's pods cost the engine little memory.
func stripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace, Name: p.Name, UID: p.UID, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
			CreationTimestamp: p.CreationTimestamp,
		},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{
			Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs,
		},
	}
	out.Spec.Containers = portsOnly(p.Spec.Containers)
	out.Spec.InitContainers = portsOnly(p.Spec.InitContainers)
	return out, nil
}

func portsOnly(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		if len(c.Ports) > 0 {
			out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return out
}

// stripMeta drops managedFields and annotations (last-applied copies of
// whole objects) from Namespaces and NetworkPolicies.
func stripMeta(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Namespace:
		o.ManagedFields, o.Annotations = nil, nil
	case *networkingv1.NetworkPolicy:
		o.ManagedFields, o.Annotations = nil, nil
	}
	return obj, nil
}

// stripCluster keeps of a Node only its name, labels and status.addresses
// (what ClusterNetworkPolicy's nodes peers read: a cluster's Nodes then
// cost the engine a few hundred bytes each), and drops managedFields,
// annotations and status from ClusterNetworkPolicies.
func stripCluster(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Node:
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: o.Name, UID: o.UID, Labels: o.Labels, ResourceVersion: o.ResourceVersion},
			Status:     corev1.NodeStatus{Addresses: o.Status.Addresses},
		}, nil
	case *cnpv1.ClusterNetworkPolicy:
		o.ManagedFields, o.Annotations = nil, nil
		o.Status = cnpv1.ClusterNetworkPolicyStatus{}
	}
	return obj, nil
}
