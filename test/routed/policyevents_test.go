package routed

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/routed/kube"
	"github.com/podnet/podnet/test/nettest"
)

// lockedBuffer is a log sink several goroutines write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPolicyEventOnePerCluster: the policy engines of three nodes each
// post the Event about one refused NetworkPolicy to a real API server:
// the cluster gets one Event (the first poster's), carrying the policy's
// UID, and the others log no failure. A different message is another
// Event.
func TestPolicyEventOnePerCluster(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	np, err := c.client.NetworkingV1().NetworkPolicies("default").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, node := range []string{"node-a", "node-b", "node-c"} {
		p := kube.NewPolicyEvents(c.client.CoreV1().RESTClient(), node, log)
		go p.Run(ctx)
		p.Policy(np.Namespace, np.Name, np.UID, corev1.EventTypeWarning, "PolicyRefused", "podnet refuses this NetworkPolicy: spec.x: bad")
		if node == "node-c" {
			p.Policy(np.Namespace, np.Name, np.UID, corev1.EventTypeNormal, "PolicyAccepted", "podnet enforces this NetworkPolicy again")
		}
	}
	nettest.Eventually(t, 20*time.Second, "one Event per message", func() error {
		list, err := c.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=NetworkPolicy"})
		if err != nil {
			return err
		}
		if n := strings.Count(logs.String(), "event already posted"); n != 2 {
			return fmt.Errorf("%d posters found the Event there, want 2 (log: %s)", n, logs.String())
		}
		if len(list.Items) != 2 {
			return fmt.Errorf("%d Events, want 2: %+v", len(list.Items), list.Items)
		}
		for _, e := range list.Items {
			if e.InvolvedObject.UID != np.UID || e.InvolvedObject.Name != "deny-all" || e.Count != 1 || e.Source.Component != "podnet-routed" {
				return fmt.Errorf("Event %s: involved %+v, count %d, source %+v", e.Name, e.InvolvedObject, e.Count, e.Source)
			}
		}
		return nil
	})
	if strings.Contains(logs.String(), "cannot post event") {
		t.Errorf("a poster logged a failure:\n%s", logs.String())
	}
	if got := kube.PolicyEventName(strings.Repeat("a", 253), np.UID, "PolicyRefused", "m"); len(got) > 253 {
		t.Errorf("event name of a 253-character policy name is %d characters", len(got))
	}
}
