package veth

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
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
	load := loadConf

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
	t.Run("policyWait read", func(t *testing.T) {
		c, err := load(conf(`,"policyWait":"250ms"`))
		if err != nil {
			t.Fatal(err)
		}
		if c.PolicyWait == nil || time.Duration(*c.PolicyWait) != 250*time.Millisecond {
			t.Fatalf("policyWait %v, want 250ms", c.PolicyWait)
		}
	})
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
		{"policyWait not a duration", conf(`,"policyWait":"soon"`), 7},
		{"policyWait a number", conf(`,"policyWait":3`), 7},
		{"policyWait negative", conf(`,"policyWait":"-1s"`), 7},
		{"policyWait over a minute", conf(`,"policyWait":"2m"`), 7},
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
