// Package cnp runs upstream's ClusterNetworkPolicy conformance suite
// (sigs.k8s.io/network-policy-api/conformance v0.3.0, profile
// ClusterNetworkPolicy, every experimental feature) against the cluster of
// scripts/k8s/cluster.sh: `make cnp`, and a subset in `make test`.
//
// It is its own Go module so that the suite's dependencies
// (controller-runtime, testify) stay out of podnet's. The tests are
// upstream's, unchanged; this package only selects them, leaves out what
// this machine's kernel cannot run (SCTP), and writes the report.
package cnp
