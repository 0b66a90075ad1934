package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/test/nettest"
)

// repairWhole: node 1's policy tables broken more ways than
// TableRepaired's deleted table, each while web is isolated for ingress
// (allow-client): an element added (other's address in the peers that let
// the clients in: only the nftables monitor's notice reads the table back
// before the tenth resync), one element deleted (web's entries in the
// verdict maps: its address and, on podnet, its host veth), `nft flush
// ruleset` (every table of the node), and on podnet-bridge the bridge
// family's table deleted. After each, within one resync (2 s here), the table is back,
// podnet_repairs_total{object="policy-table"} has counted it, and a
// connection web's policy refuses is refused again while clients still
// get through.
func (e *env) repairWhole(t *testing.T) {
	ctx := context.Background()
	bridged := e.c.Cfg.Plugin == "podnet-bridge"
	webVeth := contract.HostVethName("prod", "web", "", "eth0")
	breaks := []struct {
		what string
		nft  [][]string
	}{
		{"web's verdict map elements deleted", func() [][]string {
			if bridged { // judged by its address
				return [][]string{{"delete", "element", "inet", "podnet-policy", "ingress4", "{ " + e.web.IP.String() + " }"}}
			}
			// judged by its port
			return [][]string{
				{"delete", "element", "inet", "podnet-policy", "ingress-ports", `{ "` + webVeth + `" }`},
				{"delete", "element", "inet", "podnet-policy", "hairpin4", `{ "` + webVeth + `" . ` + e.web.IP.String() + " }"},
			}
		}()},
		{"nft flush ruleset", [][]string{{"flush", "ruleset"}}},
	}
	// an element added (no deletion): other let in beside the clients
	set := e.peersSetOf(t, e.client.IP.String())
	breaks = append([]struct {
		what string
		nft  [][]string
	}{{"other's address added to " + set, [][]string{{"add", "element", "inet", "podnet-policy", set, "{ " + e.other.IP.String() + " }"}}}}, breaks...)
	if bridged {
		breaks = append(breaks, struct {
			what string
			nft  [][]string
		}{"table bridge podnet-policy deleted", [][]string{{"delete", "table", "bridge", "podnet-policy"}}})
	}
	for _, b := range breaks {
		before, _ := repairs(e.n1)
		for _, args := range b.nft {
			if out, err := e.n1.NS.Exec(ctx, "nft", args...); err != nil {
				t.Fatalf("%s: nft %s: %v: %s", b.what, strings.Join(args, " "), err, out)
			}
		}
		start := time.Now()
		err := nettest.Poll(ctx, converge, 100*time.Millisecond, func() error {
			for _, tbl := range [][]string{{"inet", "podnet-policy"}, {"bridge", "podnet-policy"}} {
				if _, err := e.n1.NS.Exec(ctx, "nft", "list", "table", tbl[0], tbl[1]); err != nil {
					return fmt.Errorf("table %s %s: %w", tbl[0], tbl[1], err)
				}
			}
			if v, ok := repairs(e.n1); !ok || v <= before {
				return fmt.Errorf("podnet_repairs_total{object=\"policy-table\"} %v (present %v), was %v", v, ok, before)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: not repaired: %v", b.what, err)
			continue
		}
		t.Logf("%s: repaired and counted after %v", b.what, time.Since(start).Round(time.Millisecond))
		e.expect(t, "after the repair of: "+b.what, converge, both(allow(e.client, e.web, "tcp", portMain), deny(e.other, e.web, "tcp", portMain))...)
	}
}

// peersSetOf is the name of node 1's IPv4 peers set that holds ip.
func (e *env) peersSetOf(t *testing.T, ip string) string {
	t.Helper()
	ctx := context.Background()
	out, err := e.n1.NS.Exec(ctx, "nft", "-j", "list", "table", "inet", "podnet-policy")
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	var listing struct {
		Nftables []struct {
			Set *struct {
				Name string `json:"name"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &listing); err != nil {
		t.Fatalf("nft -j list table: %v", err)
	}
	for _, o := range listing.Nftables {
		if o.Set == nil || !strings.HasSuffix(o.Set.Name, "-peers4") {
			continue
		}
		if _, err := e.n1.NS.Exec(ctx, "nft", "get", "element", "inet", "podnet-policy", o.Set.Name, "{ "+ip+" }"); err == nil {
			return o.Set.Name
		}
	}
	t.Fatalf("no peers set of node 1 holds %s", ip)
	return ""
}
