package veth

import "github.com/containernetworking/cni/pkg/skel"

// RoutedFailingAfter and BridgedFailingAfter are the verbs of podnet and
// podnet-bridge with the failure injector failAfter (plugin.failAfter), for
// the rollback tests. Those are in package veth_test: they use test/nettest,
// which imports this package.
func RoutedFailingAfter(failAfter func(step string) error) skel.CNIFuncs {
	p := newRoutedPlugin()
	p.failAfter = failAfter
	return p.funcs()
}

func BridgedFailingAfter(failAfter func(step string) error) skel.CNIFuncs {
	p := newBridgedPlugin()
	p.failAfter = failAfter
	return p.funcs()
}
