package ipam

import (
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam/store"
)

// BootIDPath is the kernel's boot ID, which changes at every boot.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// ReadBootID returns the boot ID in path ("" when it cannot be read).
func ReadBootID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// metaOf is what ADD records with the attachment (store.Meta): the netns
// and its inode, the pod CNI_ARGS name, the time and the boot ID. A field
// that cannot be had, or is too long to record, stays empty; it only makes
// podnet-routed's later judgement of the attachment more careful.
func metaOf(req Request, now time.Time) store.Meta {
	m := store.Meta{Netns: req.Netns, Created: now, BootID: ReadBootID(BootIDPath)}
	if req.Netns != "" {
		var st unix.Stat_t
		if unix.Stat(req.Netns, &st) == nil {
			m.NetnsIno = st.Ino
		}
	}
	for _, kv := range strings.Split(req.Args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			m.PodNamespace = v
		case "K8S_POD_NAME":
			m.PodName = v
		case "K8S_POD_UID":
			m.PodUID = v
		}
	}
	if store.CheckMeta(m) != nil {
		m = store.Meta{Created: now, BootID: m.BootID}
	}
	return m
}
