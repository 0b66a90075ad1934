package cluster

import "testing"

// TestMetricLabelWithSpaces: a label value with spaces (a
// ClusterNetworkPolicy rule's name) does not hide its series.
func TestMetricLabelWithSpaces(t *testing.T) {
	body := `# HELP x
podnet_policy_cluster_drops_total{policy="p",rule="ingress 0 deny all",tier="Admin"} 7
podnet_policy_cluster_drops_total{policy="q",rule="egress 1",tier="Baseline"} 2
podnet_policy_cluster_policies 3
`
	if v, ok := Metric(body, "podnet_policy_cluster_drops_total", `rule="ingress 0 deny all"`); !ok || v != 7 {
		t.Errorf("rule with spaces: %v %v, want 7", v, ok)
	}
	if v, ok := Metric(body, "podnet_policy_cluster_drops_total"); !ok || v != 9 {
		t.Errorf("sum: %v %v, want 9", v, ok)
	}
	if v, ok := Metric(body, "podnet_policy_cluster_policies"); !ok || v != 3 {
		t.Errorf("no labels: %v %v, want 3", v, ok)
	}
}
