package veth

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
)

// cniCode returns the code of err as a CNI error, failing when it is not one.
func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a CNI *types.Error", err, err)
	}
	return e.Code
}

func TestParseArgs(t *testing.T) {
	t.Run("picks pod namespace and name, ignores other keys", func(t *testing.T) {
		got, err := parseArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234")
		if err != nil {
			t.Fatal(err)
		}
		if want := (podArgs{PodNamespace: "default", PodName: "web-0"}); got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})
	t.Run("empty", func(t *testing.T) {
		got, err := parseArgs("")
		if err != nil || got != (podArgs{}) {
			t.Errorf("ParseArgs(\"\") = %+v, %v; want zero, nil", got, err)
		}
	})
	t.Run("only other keys", func(t *testing.T) {
		got, err := parseArgs("IgnoreUnknown=1;FOO=bar")
		if err != nil || got != (podArgs{}) {
			t.Errorf("got %+v, %v; want zero, nil", got, err)
		}
	})
	t.Run("empty entries and values", func(t *testing.T) {
		got, err := parseArgs(";K8S_POD_NAMESPACE=ns;;K8S_POD_NAME=;")
		if err != nil {
			t.Fatal(err)
		}
		if want := (podArgs{PodNamespace: "ns"}); got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})
	t.Run("value containing =", func(t *testing.T) {
		got, err := parseArgs("K8S_POD_NAME=a=b")
		if err != nil || got.PodName != "a=b" {
			t.Errorf("got %+v, %v; want PodName a=b", got, err)
		}
	})
	t.Run("entry without value is rejected with code 4", func(t *testing.T) {
		_, err := parseArgs("K8S_POD_NAMESPACE=default;novalue")
		if err == nil {
			t.Fatal("ParseArgs accepted an entry that is not KEY=VALUE")
		}
		if code := cniCode(t, err); code != types.ErrInvalidEnvironmentVariables {
			t.Errorf("code %d, want 4 (invalid environment variables)", code)
		}
		if !strings.Contains(err.Error(), "novalue") {
			t.Errorf("error %q does not name the bad entry", err)
		}
	})
}

func TestLoadConf(t *testing.T) {
	conf := func(extra string) []byte {
		return []byte(`{"cniVersion":"1.0.0","name":"podnet","type":"podnet","ipam":{"type":"host-local"}` + extra + `}`)
	}
	load := func(stdin []byte) (*netConf, error) {
		var c netConf
		err := loadConf(stdin, &c, &c)
		return &c, err
	}

	t.Run("minimal", func(t *testing.T) {
		c, err := load(conf(""))
		if err != nil {
			t.Fatal(err)
		}
		if c.Name != "podnet" || c.IPAM.Type != "host-local" || c.MTU != 0 || c.PrevResult != nil {
			t.Errorf("unexpected conf %+v", c)
		}
	})
	for _, mtu := range []int{minMTU, 1400, 9000, maxMTU} {
		t.Run(fmt.Sprintf("mtu %d accepted", mtu), func(t *testing.T) {
			c, err := load(conf(fmt.Sprintf(`,"mtu":%d`, mtu)))
			if err != nil {
				t.Fatal(err)
			}
			if c.MTU != mtu {
				t.Errorf("MTU %d, want %d", c.MTU, mtu)
			}
		})
	}
	t.Run("valid prevResult decoded", func(t *testing.T) {
		c, err := load(conf(`,"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.244.30.2/24"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if c.PrevResult == nil {
			t.Fatal("prevResult was not decoded")
		}
	})

	for _, c := range []struct {
		name  string
		stdin []byte
		code  uint
	}{
		{"missing ipam", []byte(`{"cniVersion":"1.0.0","name":"podnet","type":"podnet"}`), 7},
		{"ipam without type", []byte(`{"cniVersion":"1.0.0","name":"podnet","type":"podnet","ipam":{"subnet":"10.0.0.0/24"}}`), 7},
		{"mtu 100", conf(`,"mtu":100`), 7},
		{"mtu below minimum", conf(fmt.Sprintf(`,"mtu":%d`, minMTU-1)), 7},
		{"mtu above maximum", conf(fmt.Sprintf(`,"mtu":%d`, maxMTU+1)), 7},
		{"negative mtu", conf(`,"mtu":-1`), 7},
		{"not JSON", []byte(`{"name":`), 7},
		{"mtu not a number", conf(`,"mtu":"1400"`), 7},
		{"bad prevResult address", conf(`,"prevResult":{"ips":[{"address":"not-an-ip"}]}`), 6},
		{"bad prevResult shape", conf(`,"prevResult":{"interfaces":"eth0"}`), 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := load(c.stdin)
			if err == nil {
				t.Fatalf("LoadConf accepted %s", c.stdin)
			}
			if code := cniCode(t, err); code != c.code {
				t.Errorf("code %d (%v), want %d", code, err, c.code)
			}
		})
	}
}

func TestRollback(t *testing.T) {
	t.Run("newest first, once", func(t *testing.T) {
		var ran []int
		r := &undoStack{}
		for i := 1; i <= 3; i++ {
			r.push(func() error { ran = append(ran, i); return nil })
		}
		r.run()
		if want := []int{3, 2, 1}; !slices.Equal(ran, want) {
			t.Fatalf("undos ran as %v, want %v", ran, want)
		}
		r.run()
		if want := []int{3, 2, 1}; !slices.Equal(ran, want) {
			t.Errorf("second Run re-ran undos: %v", ran)
		}
	})

	t.Run("a failing undo does not stop the others and is logged", func(t *testing.T) {
		var buf bytes.Buffer
		var ran []string
		r := &undoStack{log: slog.New(slog.NewTextHandler(&buf, nil))}
		r.push(func() error { ran = append(ran, "ipam"); return nil })
		r.push(func() error { ran = append(ran, "veth"); return errors.New("veth busy") })
		r.push(func() error { ran = append(ran, "route"); return nil })
		r.run()
		if want := []string{"route", "veth", "ipam"}; !slices.Equal(ran, want) {
			t.Errorf("undos ran as %v, want %v", ran, want)
		}
		if !strings.Contains(buf.String(), "veth busy") {
			t.Errorf("undo failure not logged; log: %q", buf.String())
		}
	})

	t.Run("failing undo without a logger", func(t *testing.T) {
		ran := 0
		r := &undoStack{}
		r.push(func() error { ran++; return errors.New("boom") })
		r.push(func() error { ran++; return errors.New("boom") })
		r.run()
		if ran != 2 {
			t.Errorf("%d undos ran, want 2", ran)
		}
	})

	t.Run("push after run", func(t *testing.T) {
		var ran []string
		r := &undoStack{}
		r.push(func() error { ran = append(ran, "old"); return nil })
		r.run()
		r.push(func() error { ran = append(ran, "new"); return nil })
		r.run()
		if want := []string{"old", "new"}; !slices.Equal(ran, want) {
			t.Errorf("undos ran as %v, want %v", ran, want)
		}
	})

	t.Run("empty", func(t *testing.T) {
		(&undoStack{}).run()
	})
}

// TestLoggerRefusesSymlinkAndFIFO: a symlink planted at logFile must not
// make the plugin (root) append to the file it points to, and a FIFO must
// not block it; a regular file is logged to.
func TestLoggerRefusesSymlinkAndFIFO(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.WriteFile(outside, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "podnet.log")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.log")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, fifo} {
		log, done := newLogger(&netConf{LogFile: p}, "podnet")
		log.Info("hello")
		done()
	}
	if b, _ := os.ReadFile(outside); string(b) != "precious\n" {
		t.Errorf("the symlink's target was written: %q", b)
	}
	regular := filepath.Join(dir, "regular.log")
	log, done := newLogger(&netConf{LogFile: regular}, "podnet")
	log.Info("hello")
	done()
	if b, _ := os.ReadFile(regular); !strings.Contains(string(b), `"msg":"hello"`) {
		t.Errorf("regular log file: %q", b)
	}
}
