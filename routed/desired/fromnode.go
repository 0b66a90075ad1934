// The Kubernetes Node as routing reads it: FromNode turns a core/v1 Node
// into a desired.Node, and NewRecord into the node informer's compact
// copy of it (Transform).

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

// Record is the node informer's copy of a Node (Transform makes it): the
// Node as routing reads it, parsed once (FromNode), and what the informer
// itself needs of the object: its name (the key, through GetObjectMeta)
// and its resourceVersion (an update that keeps it is a resync, which no
// handler hears). A *corev1.Node in the store costs about 900 bytes of a
// mostly empty struct per Node, plus every string it was decoded with; a
// Record about a quarter of that, and its PodCIDRs are shared with the
// plan the full apply builds instead of parsed again each time.
type Record struct {
	Node
	ResourceVersion string
	// Labels and Addresses (status.addresses, as they are) are kept
	// only when asked (Transform's peers): the NetworkPolicy engine reads
	// them for ClusterNetworkPolicy's nodes peers (NodeFields).
	Labels    map[string]string
	Addresses []string
}

// NewRecord is n's Record; peers keeps its labels and addresses too.
func NewRecord(n *corev1.Node, peers bool) *Record {
	r := &Record{Node: FromNode(n), ResourceVersion: n.ResourceVersion}
	if peers {
		r.Labels = n.Labels
		r.Addresses = make([]string, 0, len(n.Status.Addresses))
		for _, a := range n.Status.Addresses {
			r.Addresses = append(r.Addresses, a.Address)
		}
	}
	return r
}

// GetObjectMeta is what the informer's key function and its update
// handling read: the name and the resourceVersion.
func (r *Record) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: r.Name, ResourceVersion: r.ResourceVersion}
}

// NodeFields are the Node's name, labels and status.addresses (nil when
// the Record was made without peers): what the NetworkPolicy engine
// reads of a Node.
func (r *Record) NodeFields() (name string, labels map[string]string, addresses []string) {
	return r.Name, r.Labels, r.Addresses
}

// Transform is the node informer's transform: a *corev1.Node becomes its
// Record (peers: with its labels and addresses); anything else (a
// tombstone) passes.
func Transform(peers bool) func(any) (any, error) {
	return func(obj any) (any, error) {
		if n, ok := obj.(*corev1.Node); ok {
			return NewRecord(n, peers), nil
		}
		return obj, nil
	}
}
