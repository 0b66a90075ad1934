package daemon

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// One wake-up can stand for several reasons; the strongest wins, so that a
// repair or a link change is never swallowed by a pending Node event (a
// Node event alone applies only the changed Nodes, which would not put a
// deleted route back).
func TestTriggersCoalesce(t *testing.T) {
	d := &Daemon{kick: make(chan struct{}, 1)}
	d.nodeChanged(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}})
	d.trigger("repair")
	d.nodeChanged(cache.DeletedFinalStateUnknown{Key: "c"})
	if len(d.kick) != 1 {
		t.Fatalf("%d wake-ups pending, want 1", len(d.kick))
	}
	if why := d.takePending(); why != "repair" {
		t.Fatalf("node + repair: took %q, want repair", why)
	}
	if why := d.takePending(); why != "" {
		t.Fatalf("nothing left: took %q", why)
	}
	names := d.takeDirty()
	if _, ok := names["b"]; !ok || len(names) != 2 {
		t.Fatalf("dirty Nodes %v, want b and c (a full apply takes them)", names)
	}
	if _, ok := names["c"]; !ok {
		t.Fatalf("dirty Nodes %v: the deleted Node's tombstone is missing", names)
	}

	d.trigger("node")
	d.trigger("link change")
	d.trigger("repair")
	if why := d.takePending(); why != "link change" {
		t.Fatalf("took %q, want link change (it dumps the table)", why)
	}
	d.trigger("node")
	if why := d.takePending(); why != "node" {
		t.Fatalf("took %q, want node", why)
	}
}
