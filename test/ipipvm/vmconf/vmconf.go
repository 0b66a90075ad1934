// Package vmconf is the contract between the IPIP VM test on the host
// (test/ipipvm) and the program it runs inside the VM (test/ipipvm/guest):
// where the initramfs puts things, the JSON configuration the host writes,
// and the console markers the host looks for.
package vmconf

// Paths inside the VM.
const (
	ConfigPath      = "/ipipvm/config.json"
	KubeconfigPath  = "/ipipvm/routed.kubeconfig" // podnet-routed's (ServiceAccount token)
	BinDir          = "/ipipvm/bin"               // podnet, podnet-ipam, podnet-routed
	GuestPath       = "/ipipvm/guest"
	APIServerHostIP = "10.0.2.2" // QEMU user networking: the host's loopback
	GuestMgmtIP     = "10.0.2.15"
)

// Console markers. Exactly one of them ends a run that did not crash.
const (
	PassMarker = "PODNET-IPIP-PASS"
	FailMarker = "PODNET-IPIP-FAIL: "
	// ResultPrefix starts the lines with measured numbers the host reports.
	ResultPrefix = "PODNET-IPIP-RESULT: "
)

// Node is one simulated node: a network namespace in the VM with its own
// QEMU NIC (user networking, to reach the API server) and an underlay veth
// on a bridge shared by all nodes.
type Node struct {
	Name       string `json:"name"`
	UnderlayIP string `json:"underlayIP"` // the Node's InternalIP, on eth0 (/UnderlayBits)
	PodCIDR    string `json:"podCIDR"`
	MgmtMAC    string `json:"mgmtMAC"` // MAC of the QEMU NIC moved into this node
	// UsePodCIDR makes the pod's IPAM config say "usePodCidr" (read from
	// node.json written by podnet-routed) instead of the explicit PodCIDR.
	UsePodCIDR bool `json:"usePodCIDR"`
}

// Config is what the host tells the guest.
type Config struct {
	APIServer    string `json:"apiServer"` // https://10.0.2.2:<port>
	CAPEM        string `json:"caPEM"`
	AdminToken   string `json:"adminToken"` // for the guest's own API calls
	ClusterCIDR  string `json:"clusterCIDR"`
	UnderlayBits int    `json:"underlayBits"`
	Nodes        []Node `json:"nodes"`
	// DeleteNode is removed through the API server at the end; the other
	// nodes must withdraw its route.
	DeleteNode string `json:"deleteNode"`
	// DeadlineSeconds bounds the whole guest run.
	DeadlineSeconds int `json:"deadlineSeconds"`
}
