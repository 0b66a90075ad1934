package nettest

import "testing"

// TestIperfGbps: the receiver's rate of a report; an error for a report
// that carries iperf3's error, for output that is not JSON and for none.
func TestIperfGbps(t *testing.T) {
	got, err := IperfGbps([]byte(`{"end":{"sum_received":{"bits_per_second":9.5e9}}}`))
	if err != nil || got != 9.5 {
		t.Fatalf("IperfGbps = %v, %v; want 9.5", got, err)
	}
	for _, bad := range []string{`{"error":"unable to connect to server"}`, `iperf3: error`, ``, `{"end":`} {
		if g, err := IperfGbps([]byte(bad)); err == nil {
			t.Errorf("IperfGbps(%q) = %v, want an error", bad, g)
		}
	}
}
