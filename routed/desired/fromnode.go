// The Kubernetes Node as routing reads it: FromNode turns a core/v1 Node
// into a desired.Node, and SlimNode trims a Node to the fields FromNode
// reads (the node informer's transform).

package desired

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeIPAnnotation overrides a node's InternalIP.
const NodeIPAnnotation = "podnet.io/node-ip"

// FromNode extracts what routing needs from a Node (ParseNode judges the
// fields).
func FromNode(n *corev1.Node) Node {
	addrs := make([]Address, 0, len(n.Status.Addresses))
	for _, a := range n.Status.Addresses {
		addrs = append(addrs, Address{Internal: a.Type == corev1.NodeInternalIP, Address: a.Address})
	}
	var annotation *string
	if a, ok := n.Annotations[NodeIPAnnotation]; ok {
		annotation = &a
	}
	return ParseNode(n.Name, string(n.UID), n.CreationTimestamp.Time, n.Spec.PodCIDR, n.Spec.PodCIDRs, addrs, annotation)
}

// SlimNode is the node informer's transform: a Node reduced to what
// FromNode reads (name, age, PodCIDRs, addresses, the node-ip
// annotation) plus the identity the informer keeps. Anything else (a
// tombstone) passes.
func SlimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, CreationTimestamp: n.CreationTimestamp},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
	if a, ok := n.Annotations[NodeIPAnnotation]; ok {
		slim.Annotations = map[string]string{NodeIPAnnotation: a}
	}
	return slim, nil
}
