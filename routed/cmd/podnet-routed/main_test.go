package main

import (
	"strings"
	"testing"
)

// Flags are an operator's input: the ones that would make podnet-routed
// refuse every Node, or route the whole internet, stop it at start with
// what to do, before it touches anything.
func TestRunRefusesBadFlags(t *testing.T) {
	base := []string{"--node-name=n1", "--kubeconfig=/nonexistent"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--cluster-cidr (or CLUSTER_CIDR) is required"},
		{[]string{"--cluster-cidr=0.0.0.0/0"}, "default route"},
		{[]string{"--cluster-cidr=127.0.0.0/16"}, "reserved range"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--service-cidr=10.0.0.0/8"}, "holds the cluster CIDR 10.244.0.0/16"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--service-cidr=bogus"}, "--service-cidr"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--encap=gre"}, "unknown encapsulation"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--reconcile-interval=-1s"}, "must not be negative"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--reconcile-grace=-1s"}, "must not be negative"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--ipam-data-dir=relative/dir"}, "want an absolute path"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--cri-socket=tcp://10.0.0.1:1234"}, "want unix:///absolute/path"},
	} {
		t.Setenv("CLUSTER_CIDR", "")
		t.Setenv("SERVICE_CIDR", "")
		err := run(append(append([]string{}, base...), tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}
