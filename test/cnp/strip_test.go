package cnp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"text/template"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"

	"sigs.k8s.io/network-policy-api/conformance"
	"sigs.k8s.io/network-policy-api/conformance/utils/kubernetes"
)

// TestStripSCTPServers applies StripSCTPServers to the suite's own base
// manifests: each StatefulSet loses exactly its containers that serve SCTP
// (agnhost porter with SERVE_SCTP_PORT_*) and keeps every other one (the
// client, the TCP and UDP servers) unchanged.
func TestStripSCTPServers(t *testing.T) {
	data, err := conformance.Manifests.ReadFile("base/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// the manifests are templates of the host network ports
	tmpl, err := template.New("base").Parse(string(data))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, kubernetes.TemplateData{HostNetworkPorts: []int{34345, 34346, 34347, 34348, 34349, 34350, 34351, 34352}}); err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(&buf, 4096)
	sets := 0
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if u.GetKind() != "StatefulSet" {
			if n, err := StripSCTPServers(u); n != 0 || err != nil {
				t.Errorf("%s %s: removed %d (%v)", u.GetKind(), u.GetName(), n, err)
			}
			continue
		}
		sets++
		before, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		n, err := StripSCTPServers(u)
		if err != nil {
			t.Fatal(err)
		}
		after, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		var sctp, kept []string
		for _, c := range before {
			name := c.(map[string]any)["name"].(string)
			cmd, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "command")
			if strings.Contains(strings.Join(cmd, " "), "porter") {
				sctp = append(sctp, name)
			}
		}
		for _, c := range after {
			kept = append(kept, c.(map[string]any)["name"].(string))
			if servesSCTP(c) {
				t.Errorf("%s: %v still serves SCTP", u.GetName(), c)
			}
		}
		if n != len(sctp) || n == 0 || len(after) != len(before)-n {
			t.Errorf("%s: removed %d of %d containers, SCTP servers %v, kept %v", u.GetName(), n, len(before), sctp, kept)
		}
		t.Logf("%s: kept %v, removed %v", u.GetName(), kept, sctp)
	}
	if sets != 5 {
		t.Errorf("%d StatefulSets in the base manifests, want 5", sets)
	}
}
