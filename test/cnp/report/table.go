package main

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/network-policy-api/conformance/tests"
)

// counts: [tests, subtests] x [passed, failed, skipped, not run]
type counts [2][4]int

// table: the report's rows, each test of the suite in the suite's order
// with its subtests under it, and the totals.
func table(res map[string]*result, reason map[string]string, sel *regexp.Regexp, all bool) ([]string, counts) {
	var rows []string
	var c counts
	for _, ct := range tests.ConformanceTests {
		name := ct.ShortName
		if !all && !sel.MatchString(name) {
			rows = append(rows, fmt.Sprintf("| %s | not selected | | `make cnp` runs it |", name))
			continue
		}
		if r, ok := reason[name]; ok {
			c[0][2]++
			rows = append(rows, fmt.Sprintf("| %s | skipped | | %s |", name, esc(r)))
			continue
		}
		r := res[name]
		rows = append(rows, row(name, r, &c[0]))
		// its subtests: the ones that ran, and the skipped ones
		subs := map[string]bool{}
		for k := range res {
			if strings.HasPrefix(k, name+"/") {
				subs[k] = true
			}
		}
		for k := range reason {
			if strings.HasPrefix(k, name+"/") {
				subs[k] = true
			}
		}
		keys := make([]string, 0, len(subs))
		for k := range subs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			label := "&nbsp;&nbsp;" + strings.ReplaceAll(strings.TrimPrefix(k, name+"/"), "_", " ")
			if rs, ok := reason[k]; ok {
				c[1][2]++
				rows = append(rows, fmt.Sprintf("| %s | skipped | | %s |", esc(label), esc(rs)))
				continue
			}
			rows = append(rows, row(label, res[k], &c[1]))
		}
	}
	return rows, c
}

func row(label string, r *result, c *[4]int) string {
	switch {
	case r == nil || r.action == "":
		c[3]++
		return fmt.Sprintf("| %s | **not run** | | it did not start or did not end (the run's log) |", esc(label))
	case r.action == "pass":
		c[0]++
		return fmt.Sprintf("| %s | passed | %.0fs | |", esc(label), r.elapsed)
	case r.action == "skip":
		c[2]++
		return fmt.Sprintf("| %s | skipped | | %s |", esc(label), esc(skipWhy(r)))
	default:
		c[1]++
		return fmt.Sprintf("| %s | **failed** | %.0fs | %s |", esc(label), r.elapsed, esc(why(r)))
	}
}

// skipWhy: the reason a test skipped itself (its t.Skip message).
func skipWhy(r *result) string {
	for _, l := range slices.Backward(r.output) {
		if strings.Contains(l, "Skipping") || strings.Contains(l, "skip") {
			return strings.TrimSpace(l)
		}
	}
	return "skipped by the suite"
}

func esc(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
