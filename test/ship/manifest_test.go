package ship

import (
	"context"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/test/kapi"
)

const manifestPath = "conf/k8s/podnet.yaml"

// TestManifestApplies server-side applies conf/k8s/podnet.yaml to a real
// kube-apiserver, first as a dry run and then for real, and checks what
// the server stored: the RBAC is conf/podnet-routed-rbac.yaml's and grants
// reading Nodes only, and the DaemonSet is what the operator docs promise.
func TestManifestApplies(t *testing.T) {
	objs := readObjects(t, filepath.Join(repo(t), manifestPath))
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(kinds)
	want := []string{"ClusterRole/podnet-routed", "ClusterRoleBinding/podnet-routed", "ConfigMap/podnet-config", "DaemonSet/podnet-node", "ServiceAccount/podnet-routed"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("%s holds %v, want %v", manifestPath, kinds, want)
	}

	s := kapi.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig(kapi.AdminUser, ""))
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	client := s.Client()
	ctx := context.Background()

	// kube-system and the system priority classes are made by the API
	// server itself shortly after it starts.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err1 := client.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
		_, err2 := client.SchedulingV1().PriorityClasses().Get(ctx, "system-node-critical", metav1.GetOptions{})
		if err1 == nil && err2 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-system / system-node-critical not there: %v, %v", err1, err2)
		}
		time.Sleep(200 * time.Millisecond)
	}

	for _, dryRun := range []bool{true, false} {
		for _, o := range objs {
			gvk := o.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %v", gvk, err)
			}
			opts := metav1.ApplyOptions{FieldManager: "podnet-ship-test", Force: true}
			if dryRun {
				opts.DryRun = []string{metav1.DryRunAll}
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if o.GetNamespace() != "" {
				ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
			}
			if _, err := ri.Apply(ctx, o.GetName(), o, opts); err != nil {
				t.Fatalf("apply %s %s (dry run %v): %v", gvk.Kind, o.GetName(), dryRun, err)
			}
		}
	}

	// The ClusterRole is the one of conf/podnet-routed-rbac.yaml, which the
	// routed tests grant; the ServiceAccount and the binding too.
	rbacFile := readObjects(t, filepath.Join(repo(t), "conf", "podnet-routed-rbac.yaml"))
	if len(rbacFile) != 3 {
		t.Fatalf("podnet-routed-rbac.yaml: %d objects, want 3", len(rbacFile))
	}
	for _, ro := range rbacFile {
		var mo *unstructured.Unstructured
		for _, o := range objs {
			if o.GetKind() == ro.GetKind() && o.GetName() == ro.GetName() && o.GetNamespace() == ro.GetNamespace() {
				mo = o
			}
		}
		if mo == nil {
			t.Fatalf("%s %s of podnet-routed-rbac.yaml is not in %s", ro.GetKind(), ro.GetName(), manifestPath)
		}
		if !reflect.DeepEqual(ro.Object, mo.Object) {
			t.Errorf("%s %s differs between podnet-routed-rbac.yaml and %s:\n%v\n%v", ro.GetKind(), ro.GetName(), manifestPath, ro.Object, mo.Object)
		}
	}
	var fileRole rbacv1.ClusterRole
	for _, ro := range rbacFile {
		if ro.GetKind() == "ClusterRole" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ro.Object, &fileRole); err != nil {
				t.Fatal(err)
			}
		}
	}
	stored, err := client.RbacV1().ClusterRoles().Get(ctx, "podnet-routed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stored.Rules, fileRole.Rules) {
		t.Errorf("stored ClusterRole rules %+v, want %+v", stored.Rules, fileRole.Rules)
	}

	// What the DaemonSet's service account may do: read Nodes, list and
	// watch what the NetworkPolicy engine reads, nothing else.
	sa := "system:serviceaccount:kube-system:podnet-routed"
	for _, c := range []struct {
		verb, resource string
		allowed        bool
	}{
		{"get", "nodes", true}, {"list", "nodes", true}, {"watch", "nodes", true},
		{"patch", "nodes", false}, {"update", "nodes", false}, {"delete", "nodes", false},
		{"list", "pods", true}, {"watch", "pods", true}, {"list", "namespaces", true}, {"watch", "namespaces", true},
		{"get", "pods/log", false}, {"create", "pods/exec", false}, {"update", "pods", false}, {"delete", "pods", false}, {"patch", "namespaces", false},
		{"list", "networking.k8s.io/networkpolicies", true}, {"watch", "networking.k8s.io/networkpolicies", true},
		{"create", "networking.k8s.io/networkpolicies", false}, {"delete", "networking.k8s.io/networkpolicies", false},
		{"get", "policy.networking.k8s.io/clusternetworkpolicies", false}, {"list", "policy.networking.k8s.io/clusternetworkpolicies", true}, {"watch", "policy.networking.k8s.io/clusternetworkpolicies", true},
		{"create", "policy.networking.k8s.io/clusternetworkpolicies", false}, {"update", "policy.networking.k8s.io/clusternetworkpolicies", false},
		{"delete", "policy.networking.k8s.io/clusternetworkpolicies", false}, {"patch", "policy.networking.k8s.io/clusternetworkpolicies/status", false},
		{"list", "apiextensions.k8s.io/customresourcedefinitions", false},
		{"get", "secrets", false}, {"create", "configmaps", false},
	} {
		group, resource, ok := strings.Cut(c.resource, "/")
		if !ok || strings.HasPrefix(c.resource, "pods/") {
			group, resource = "", c.resource
		}
		resource, sub, _ := strings.Cut(resource, "/")
		r, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: c.verb, Group: group, Resource: resource, Subresource: sub, Namespace: "kube-system"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed != c.allowed {
			t.Errorf("%s %s %s: allowed=%v, want %v", sa, c.verb, c.resource, r.Status.Allowed, c.allowed)
		}
	}

	ds, err := client.AppsV1().DaemonSets("kube-system").Get(ctx, "podnet-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, "podnet-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkDaemonSet(t, ds, cm)
}

func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap) {
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("hostNetwork is not set")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	if spec.ServiceAccountName != "podnet-routed" {
		t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
	}
	tolerateAll := false
	for _, tol := range spec.Tolerations {
		tolerateAll = tolerateAll || (tol.Key == "" && tol.Operator == corev1.TolerationOpExists && tol.Effect == "")
	}
	if !tolerateAll {
		t.Errorf("tolerations %+v do not tolerate everything", spec.Tolerations)
	}
	u := ds.Spec.UpdateStrategy
	if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("updateStrategy %+v, want RollingUpdate maxUnavailable 1", u)
	}
	for k, v := range map[string]string{"encap": "ipip", "clusterCIDR": "10.244.0.0/16", "mtu": "0", "cniVersion": "1.0.0", "plugin": "podnet", "crossSubnet": "false", "portmap": "false", "masqueradeIPv6": "auto"} {
		if cm.Data[k] != v {
			t.Errorf("ConfigMap %s=%q, want %q", k, cm.Data[k], v)
		}
	}

	if len(spec.InitContainers) != 2 || len(spec.Containers) != 1 {
		t.Fatalf("%d init containers, %d containers; want 2 and 1", len(spec.InitContainers), len(spec.Containers))
	}
	prep, inst, main := spec.InitContainers[0], spec.InitContainers[1], spec.Containers[0]

	// Image: the tag `make image` builds.
	mk := string(readFile(t, repo(t), "Makefile"))
	ver := regexp.MustCompile(`(?m)^IMAGE_VERSION\s*\?=\s*(\S+)`).FindStringSubmatch(mk)
	if ver == nil {
		t.Fatal("IMAGE_VERSION not found in Makefile")
	}
	for _, c := range []corev1.Container{prep, inst, main} {
		if c.Image != "podnet/podnet:"+ver[1] {
			t.Errorf("container %s image %q, want podnet/podnet:%s (Makefile IMAGE_VERSION)", c.Name, c.Image, ver[1])
		}
		// Every ConfigMap key it reads exists; every $(VAR) in its args is
		// one of its env vars.
		env := map[string]bool{}
		for _, e := range c.Env {
			env[e.Name] = true
			if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
				if r.ConfigMapKeyRef.Name != cm.Name {
					t.Errorf("%s: env %s from ConfigMap %s", c.Name, e.Name, r.ConfigMapKeyRef.Name)
				} else if _, ok := cm.Data[r.ConfigMapKeyRef.Key]; !ok {
					t.Errorf("%s: env %s reads missing ConfigMap key %q", c.Name, e.Name, r.ConfigMapKeyRef.Key)
				}
			}
		}
		for _, a := range append(append([]string{}, c.Command...), c.Args...) {
			for _, m := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(a, -1) {
				if !env[m[1]] {
					t.Errorf("%s: %q uses $(%s), which is not in its env", c.Name, a, m[1])
				}
			}
		}
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: capabilities must drop ALL: %+v", c.Name, sc)
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s is privileged", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation is not false", c.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("%s: no cpu/memory requests", c.Name)
		}
	}
	caps := func(c corev1.Container) []corev1.Capability { return c.SecurityContext.Capabilities.Add }
	if !slices.Equal(caps(main), []corev1.Capability{"NET_ADMIN", "SYS_NICE"}) || !slices.Equal(caps(prep), []corev1.Capability{"NET_ADMIN"}) || len(caps(inst)) != 0 {
		t.Errorf("capabilities added: prepare-node %v, install-cni %v, podnet-routed %v; want NET_ADMIN, none, NET_ADMIN and SYS_NICE (--policy-nice)", caps(prep), caps(inst), caps(main))
	}

	// The init containers run the installer; the main container the image's
	// entrypoint (podnet-routed).
	if len(prep.Command) < 2 || prep.Command[0] != "/bin/podnet-install" || prep.Command[1] != "prepare-node" {
		t.Errorf("prepare-node command %v", prep.Command)
	}
	if len(inst.Command) < 1 || inst.Command[0] != "/bin/podnet-install" {
		t.Errorf("install-cni command %v", inst.Command)
	}
	if len(main.Command) != 0 {
		t.Errorf("podnet-routed overrides the entrypoint: %v", main.Command)
	}
	checkFlags(t, "podnet-routed", nil, main.Args)
	checkFlags(t, "podnet-install", nil, inst.Command[1:])
	checkFlags(t, "podnet-install", []string{"prepare-node"}, prep.Command[2:])

	probe := func(p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.IntValue() != 9099 {
			t.Errorf("probe %+v, want GET %s on 9099", p, path)
		}
	}
	probe(main.LivenessProbe, "/healthz")
	probe(main.ReadinessProbe, "/readyz")

	mounts := func(c corev1.Container) map[string]string {
		m := map[string]string{}
		for _, vm := range c.VolumeMounts {
			for _, v := range spec.Volumes {
				if v.Name == vm.Name && v.HostPath != nil {
					m[v.HostPath.Path] = vm.MountPath
				}
			}
		}
		return m
	}
	for c, want := range map[string]map[string]string{
		"prepare-node":  {"/proc/sys/net": "/host/proc/sys/net"},
		"install-cni":   {"/opt/cni/bin": "/host/opt/cni/bin", "/etc/cni/net.d": "/host/etc/cni/net.d"},
		"podnet-routed": {"/run/podnet": "/run/podnet", "/run/containerd": "/run/containerd", "/run/netns": "/run/netns", "/proc/sys/net": "/host/proc/sys/net"},
	} {
		var got map[string]string
		for _, x := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			if x.Name == c {
				got = mounts(x)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s host mounts %v, want %v", c, got, want)
		}
	}
	if !strings.Contains(strings.Join(inst.Command, " "), "--bin-dir=/host/opt/cni/bin") || !strings.Contains(strings.Join(inst.Command, " "), "--conf-dir=/host/etc/cni/net.d") {
		t.Errorf("install-cni does not write to the mounted host dirs: %v", inst.Command)
	}
}

// checkFlags makes sure every --flag in args is one the binary defines
// (bin/<name> [sub] -h lists them).
func checkFlags(t *testing.T, name string, sub []string, args []string) {
	t.Helper()
	out, _ := exec.Command(filepath.Join(repo(t), "bin", name), append(sub, "-h")...).CombinedOutput()
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	if len(known) == 0 {
		t.Fatalf("bin/%s %v -h lists no flags (run `make`):\n%s", name, sub, out)
	}
	for _, a := range args {
		f := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
		if !known[f] {
			t.Errorf("bin/%s %v has no flag --%s (from %q)", name, sub, f, a)
		}
	}
}
