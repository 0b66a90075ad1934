package desired

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestFromNode(t *testing.T) {
	internal := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
	}
	external := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip}
	}
	hostname := corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1.example"}
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		spec        corev1.NodeSpec
		addrs       []corev1.NodeAddress
		want        Node
	}{
		{
			name:  "PodCIDRs and InternalIP",
			spec:  corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
			addrs: []corev1.NodeAddress{hostname, internal("192.168.1.2")},
			want:  Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24", "fd00:10:244:1::/64"), IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:  "PodCIDRs preferred over legacy PodCIDR",
			spec:  corev1.NodeSpec{PodCIDR: "10.99.0.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
			addrs: []corev1.NodeAddress{internal("192.168.1.2")},
			want:  Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24"), IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:  "legacy PodCIDR fallback",
			spec:  corev1.NodeSpec{PodCIDR: "10.244.1.0/24"},
			addrs: []corev1.NodeAddress{internal("192.168.1.2")},
			want:  Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24"), IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:  "no PodCIDR",
			addrs: []corev1.NodeAddress{internal("192.168.1.2")},
			want:  Node{Name: "n1", IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:  "PodCIDRs with host bits or garbage make the Node invalid",
			spec:  corev1.NodeSpec{PodCIDRs: []string{"10.244.1.7/24", "bogus", "fd00:10:244:1::/64"}},
			addrs: []corev1.NodeAddress{internal("192.168.1.2")},
			want: Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24", "fd00:10:244:1::/64"), IP: netip.MustParseAddr("192.168.1.2"),
				Invalid: `spec.podCIDRs[0] "10.244.1.7/24" has host bits set (the network is 10.244.1.0/24); spec.podCIDRs[1] "bogus" does not parse`},
		},
		{
			name:        "annotation overrides InternalIP when it is one of the Node's addresses",
			annotations: map[string]string{NodeIPAnnotation: "10.0.0.2"},
			spec:        corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			addrs:       []corev1.NodeAddress{internal("192.168.1.2"), external("10.0.0.2")},
			want:        Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24"), IP: netip.MustParseAddr("10.0.0.2")},
		},
		{
			name:        "annotation that is not one of the Node's addresses is ignored",
			annotations: map[string]string{NodeIPAnnotation: "10.0.0.2"},
			spec:        corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			addrs:       []corev1.NodeAddress{internal("192.168.1.2")},
			want: Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24"), IP: netip.MustParseAddr("192.168.1.2"),
				Note: "annotation 10.0.0.2 is not one of the Node's status.addresses: ignored"},
		},
		{
			name:        "annotation without any address is ignored",
			annotations: map[string]string{NodeIPAnnotation: "fd00:1::2"},
			spec:        corev1.NodeSpec{PodCIDRs: []string{"fd00:10:244:1::/64"}},
			want: Node{Name: "n1", PodCIDRs: pfx("fd00:10:244:1::/64"),
				Note: "annotation fd00:1::2 is not one of the Node's status.addresses: ignored"},
		},
		{
			name:        "IPv4-mapped annotation is unmapped",
			annotations: map[string]string{NodeIPAnnotation: "::ffff:10.0.0.2"},
			spec:        corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			addrs:       []corev1.NodeAddress{internal("192.168.1.2"), external("10.0.0.2")},
			want:        Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24"), IP: netip.MustParseAddr("10.0.0.2")},
		},
		{
			name:  "IPv4-mapped InternalIP is unmapped",
			addrs: []corev1.NodeAddress{internal("::ffff:192.168.1.2")},
			want:  Node{Name: "n1", IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:        "invalid annotation falls back to InternalIP",
			annotations: map[string]string{NodeIPAnnotation: "not-an-ip"},
			spec:        corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			addrs:       []corev1.NodeAddress{internal("192.168.1.2")},
			want:        Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24"), IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:        "empty annotation falls back to InternalIP",
			annotations: map[string]string{NodeIPAnnotation: ""},
			addrs:       []corev1.NodeAddress{internal("192.168.1.2")},
			want:        Node{Name: "n1", IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:        "CIDR in annotation is invalid",
			annotations: map[string]string{NodeIPAnnotation: "10.0.0.2/24"},
			addrs:       []corev1.NodeAddress{internal("192.168.1.2")},
			want:        Node{Name: "n1", IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:        "other annotations ignored",
			annotations: map[string]string{"example.com/node-ip": "10.0.0.2"},
			addrs:       []corev1.NodeAddress{internal("192.168.1.2")},
			want:        Node{Name: "n1", IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:  "ExternalIP ignored",
			spec:  corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			addrs: []corev1.NodeAddress{external("203.0.113.5"), hostname, internal("192.168.1.2")},
			want:  Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24"), IP: netip.MustParseAddr("192.168.1.2")},
		},
		{
			name:  "only ExternalIP: no address",
			spec:  corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			addrs: []corev1.NodeAddress{external("203.0.113.5"), hostname},
			want:  Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24")},
		},
		{
			name:  "first valid InternalIP wins",
			addrs: []corev1.NodeAddress{internal("garbage"), internal("192.168.1.2"), internal("fd00:1::2")},
			want:  Node{Name: "n1", IP: netip.MustParseAddr("192.168.1.2"), AltIP: netip.MustParseAddr("fd00:1::2")},
		},
		{
			name:        "invalid annotation and no address",
			annotations: map[string]string{NodeIPAnnotation: "nope"},
			spec:        corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			want:        Node{Name: "n1", PodCIDRs: pfx("10.244.1.0/24")},
		},
		{
			name: "nothing at all",
			want: Node{Name: "n1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: tc.annotations},
				Spec:       tc.spec,
				Status:     corev1.NodeStatus{Addresses: tc.addrs},
			}
			before := n.DeepCopy()
			got := FromNode(n)
			if tc.want.Note == "" {
				got.Note = "" // what an ignored annotation says: TestParseNode
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("FromNode:\n got  %+v\n want %+v", got, tc.want)
			}
			if got.IP.IsValid() != tc.want.IP.IsValid() {
				t.Errorf("IP valid = %v, want %v", got.IP.IsValid(), tc.want.IP.IsValid())
			}
			if !reflect.DeepEqual(n, before) {
				t.Errorf("FromNode modified the Node")
			}
		})
	}
}

// TestRecord: the informer keeps a Node as FromNode reads it, with the
// name and resourceVersion the informer needs, and the labels and
// addresses only when asked (peers); a tombstone passes the transform.
func TestRecord(t *testing.T) {
	full := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "n1", UID: "u1", ResourceVersion: "42",
			Labels:        map[string]string{"kubernetes.io/hostname": "n1"},
			Annotations:   map[string]string{NodeIPAnnotation: "192.0.2.7", "node.alpha.kubernetes.io/ttl": "0"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"},
				{Type: corev1.NodeExternalIP, Address: "192.0.2.7"}, {Type: corev1.NodeHostName, Address: "n1.example"}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Images:     []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 1 << 20}},
		},
	}
	for _, peers := range []bool{false, true} {
		obj, err := Transform(peers)(full)
		if err != nil {
			t.Fatal(err)
		}
		r := obj.(*Record)
		if !reflect.DeepEqual(r.Node, FromNode(full)) {
			t.Errorf("peers %v: record %+v, FromNode %+v", peers, r.Node, FromNode(full))
		}
		if r.Node.IP != netip.MustParseAddr("192.0.2.7") {
			t.Errorf("peers %v: the annotation is not applied: %v", peers, r.Node.IP)
		}
		m := r.GetObjectMeta()
		if m.GetName() != "n1" || m.GetNamespace() != "" || m.GetResourceVersion() != "42" {
			t.Errorf("peers %v: identity lost: %+v", peers, m)
		}
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(r); err != nil || key != "n1" {
			t.Errorf("peers %v: key %q %v", peers, key, err)
		}
		name, labels, addrs := r.NodeFields()
		wantAddrs := []string{"192.0.2.1", "192.0.2.7", "n1.example"}
		if peers && (name != "n1" || !reflect.DeepEqual(labels, full.Labels) || !reflect.DeepEqual(addrs, wantAddrs)) {
			t.Errorf("peers: NodeFields %q %v %v", name, labels, addrs)
		}
		if !peers && (labels != nil || addrs != nil) {
			t.Errorf("no peers: the record keeps labels %v and addresses %v", labels, addrs)
		}
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "n1", Obj: full}
	if got, err := Transform(false)(tomb); err != nil || !reflect.DeepEqual(got, tomb) {
		t.Errorf("tombstone: %v %v", got, err)
	}
}
