package validate

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kustomizeDir is the Kubernetes base.
const kustomizeDir = "../kubernetes"

var update = flag.Bool("update", false, "rewrite deploy/kubernetes/prometheusrule.yaml from deploy/prometheus/alerts.yml")

// newScheme knows every kind the base may hold; any other kind fails.
func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme, monitoringv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// decodeStrict decodes one object's YAML into its typed object (client-go's
// or the Prometheus Operator's): an unknown or duplicate field, an unknown
// kind or a value of the wrong type is an error.
func decodeStrict(s *runtime.Scheme, doc []byte) (runtime.Object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return nil, errors.New("no apiVersion or kind")
	}
	obj, err := s.New(tm.GroupVersionKind())
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// splitDocs splits a YAML stream into its documents, leaving out those
// holding only comments.
func splitDocs(b []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		empty := true
		for _, line := range strings.Split(string(doc), "\n") {
			if l := strings.TrimSpace(line); l != "" && l != "---" && !strings.HasPrefix(l, "#") {
				empty = false
			}
		}
		if !empty {
			docs = append(docs, doc)
		}
	}
}

// kustomization reads deploy/kubernetes/kustomization.yaml (strictly, into
// kustomize's own type).
func kustomization(t *testing.T) types.Kustomization {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kustomizeDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k types.Kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k
}

// kustomization.yaml lists every manifest in the directory, and each one
// it lists is there; each manifest's documents decode strictly into their
// types, with names and labels Kubernetes accepts.
func TestKustomizationListsEveryFile(t *testing.T) {
	t.Parallel()
	k := kustomization(t)
	var files []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(kustomizeDir, pat))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			if base := filepath.Base(f); base != "kustomization.yaml" {
				files = append(files, base)
			}
		}
	}
	sort.Strings(files)
	listed := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(files, listed) {
		t.Errorf("kustomization.yaml resources %q, the directory's manifests %q", listed, files)
	}
	s := newScheme(t)
	objects := 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(kustomizeDir, f))
		if err != nil {
			t.Fatal(err)
		}
		docs, err := splitDocs(b)
		if err != nil || len(docs) == 0 {
			t.Errorf("%s: %d documents, %v", f, len(docs), err)
			continue
		}
		for i, doc := range docs {
			obj, err := decodeStrict(s, doc)
			if err != nil {
				t.Errorf("%s, document %d: %v", f, i+1, err)
				continue
			}
			objects++
			checkMeta(t, f, obj)
		}
	}
	t.Logf("%d files listed, %d objects decoded strictly", len(files), objects)
	if len(files) == 0 || objects == 0 {
		t.Fatal("no manifests")
	}
}

// checkMeta checks an object's name and labels the way the API server does.
func checkMeta(t *testing.T, where string, obj runtime.Object) {
	t.Helper()
	m, ok := obj.(metav1.Object)
	if !ok {
		t.Errorf("%s: %T has no metadata", where, obj)
		return
	}
	if errs := validation.IsDNS1123Subdomain(m.GetName()); len(errs) > 0 {
		t.Errorf("%s: name %q: %v", where, m.GetName(), errs)
	}
	if m.GetNamespace() != "" {
		t.Errorf("%s: %s sets a namespace (the base leaves it to kubectl -n or an overlay)", where, m.GetName())
	}
	checkLabels(t, where+" "+m.GetName(), m.GetLabels())
}

func checkLabels(t *testing.T, where string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%s: label %q: %v", where, k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s: label %s=%q: %v", where, k, v, errs)
		}
	}
}

// base is the rendered base, by kind.
type base struct {
	deployments []*appsv1.Deployment
	jobs        []*batchv1.Job
	services    []*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	monitors    []*monitoringv1.ServiceMonitor
	rules       []*monitoringv1.PrometheusRule
	policies    []*networkingv1.NetworkPolicy
	secrets     map[string]*corev1.Secret
	configMaps  map[string]*corev1.ConfigMap
	pvcs        map[string]*corev1.PersistentVolumeClaim
	accounts    map[string]*corev1.ServiceAccount
	n           int
}

// workload is a pod template and what it belongs to.
type workload struct {
	name string
	pod  *corev1.PodTemplateSpec
}

func (b *base) workloads() []workload {
	var w []workload
	for _, d := range b.deployments {
		w = append(w, workload{"Deployment " + d.Name, &d.Spec.Template})
	}
	for _, j := range b.jobs {
		w = append(w, workload{"Job " + j.Name, &j.Spec.Template})
	}
	return w
}

// render builds the base with the kustomize library (what kubectl apply
// -k and kustomize build run) and decodes each object strictly.
func render(t *testing.T) *base {
	t.Helper()
	dir, err := filepath.Abs(kustomizeDir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build deploy/kubernetes: %v", err)
	}
	s := newScheme(t)
	b := &base{secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{},
		pvcs: map[string]*corev1.PersistentVolumeClaim{}, accounts: map[string]*corev1.ServiceAccount{}}
	for _, r := range m.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeStrict(s, doc)
		if err != nil {
			t.Errorf("rendered %s: %v", r.CurId(), err)
			continue
		}
		b.n++
		switch o := obj.(type) {
		case *appsv1.Deployment:
			b.deployments = append(b.deployments, o)
		case *batchv1.Job:
			b.jobs = append(b.jobs, o)
		case *corev1.Service:
			b.services = append(b.services, o)
		case *policyv1.PodDisruptionBudget:
			b.pdbs = append(b.pdbs, o)
		case *monitoringv1.ServiceMonitor:
			b.monitors = append(b.monitors, o)
		case *monitoringv1.PrometheusRule:
			b.rules = append(b.rules, o)
		case *networkingv1.NetworkPolicy:
			b.policies = append(b.policies, o)
		case *corev1.Secret:
			b.secrets[o.Name] = o
		case *corev1.ConfigMap:
			b.configMaps[o.Name] = o
		case *corev1.PersistentVolumeClaim:
			b.pvcs[o.Name] = o
		case *corev1.ServiceAccount:
			b.accounts[o.Name] = o
		default:
			t.Errorf("rendered %s: no check knows a %T", r.CurId(), obj)
		}
	}
	return b
}

// The rendered base: the relay and adapter Deployments with liveness,
// readiness and startup probes on ports they declare, the migrate Job,
// every pod non-root with a read-only root file system and resource
// requests and limits, every reference (Secret key, ConfigMap, volume
// claim, service account) to an object of the base, Services, PDBs and the
// ServiceMonitor selecting pods and ports that exist, and Secrets holding
// placeholders only.
func TestKubernetesBase(t *testing.T) {
	t.Parallel()
	b := render(t)
	if len(b.deployments) < 2 || len(b.jobs) != 1 || len(b.services) == 0 || len(b.pdbs) == 0 ||
		len(b.monitors) != 1 || len(b.rules) != 1 || len(b.secrets) == 0 {
		t.Fatalf("rendered %d objects: %d Deployments, %d Jobs, %d Services, %d PDBs, %d ServiceMonitors, %d PrometheusRules, %d Secrets",
			b.n, len(b.deployments), len(b.jobs), len(b.services), len(b.pdbs), len(b.monitors), len(b.rules), len(b.secrets))
	}
	for _, o := range b.secrets {
		if len(o.Data) > 0 {
			t.Errorf("Secret %s has data: the base holds placeholders in stringData only", o.Name)
		}
		for k, v := range o.StringData {
			if !strings.Contains(v, "REPLACE-ME") {
				t.Errorf("Secret %s: %s is not a REPLACE-ME placeholder", o.Name, k)
			}
		}
	}
	checks := 0
	for _, w := range b.workloads() {
		checks += checkPod(t, b, w)
	}
	migrate := false
	for _, j := range b.jobs {
		c := j.Spec.Template.Spec.Containers
		migrate = migrate || (len(c) == 1 && slices.Equal(c[0].Args, []string{"migrate"}))
	}
	if !migrate {
		t.Error("no Job runs gateway migrate")
	}
	roles := map[string]bool{}
	for _, d := range b.deployments {
		if d.Spec.Selector == nil || !labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) || len(d.Spec.Selector.MatchExpressions) > 0 {
			t.Errorf("Deployment %s: its selector does not select its own pods", d.Name)
		}
		args := d.Spec.Template.Spec.Containers[0].Args
		if flagValue(args, "dispatcher") != "false" {
			roles["relay"] = true
		}
		for _, a := range strings.Split(flagValue(args, "adapters"), ",") {
			if a != "" {
				roles["adapter "+a] = true
			}
		}
	}
	for _, want := range []string{"relay", "adapter email", "adapter file"} {
		if !roles[want] {
			t.Errorf("no Deployment runs the %s (%v)", want, roles)
		}
	}
	for _, s := range b.services {
		checkService(t, b, s)
		checks++
	}
	for _, p := range b.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		var selected []string
		for _, d := range b.deployments {
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				selected = append(selected, d.Name)
			}
		}
		if len(selected) != 1 || (p.Spec.MinAvailable == nil) == (p.Spec.MaxUnavailable == nil) {
			t.Errorf("PodDisruptionBudget %s selects the pods of %q (want one Deployment's) with minAvailable %v, maxUnavailable %v",
				p.Name, selected, p.Spec.MinAvailable, p.Spec.MaxUnavailable)
		}
		checks++
	}
	for _, d := range b.deployments {
		covered := false
		for _, p := range b.pdbs {
			sel, _ := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			covered = covered || sel.Matches(labels.Set(d.Spec.Template.Labels))
		}
		if !covered {
			t.Errorf("Deployment %s has no PodDisruptionBudget", d.Name)
		}
	}
	for _, m := range b.monitors {
		checkServiceMonitor(t, b, m)
		checks++
	}
	t.Logf("rendered %d objects: %d Deployments, %d Jobs, %d Services, %d PDBs; %d checks of pods, services, budgets and monitors",
		b.n, len(b.deployments), len(b.jobs), len(b.services), len(b.pdbs), checks)
}

// checkPod checks one pod template; it returns 1.
func checkPod(t *testing.T, b *base, w workload) int {
	t.Helper()
	ps := w.pod.Spec
	checkLabels(t, w.name+" pods", w.pod.Labels)
	sc := ps.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("%s: the pod does not run as a non-root user (%+v)", w.name, sc)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("%s: the service account token is mounted", w.name)
	}
	if _, ok := b.accounts[ps.ServiceAccountName]; !ok {
		t.Errorf("%s: service account %q is not in the base", w.name, ps.ServiceAccountName)
	}
	for _, v := range ps.Volumes {
		if c := v.PersistentVolumeClaim; c != nil {
			if _, ok := b.pvcs[c.ClaimName]; !ok {
				t.Errorf("%s: volume claim %s is not in the base", w.name, c.ClaimName)
			}
		}
	}
	if len(ps.Containers) != 1 {
		t.Errorf("%s: %d containers, want the gateway alone", w.name, len(ps.Containers))
		return 1
	}
	c := ps.Containers[0]
	if c.Image != "fencegate:latest" {
		t.Errorf("%s: image %q, want kustomization.yaml's images entry (fencegate:latest)", w.name, c.Image)
	}
	if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
		t.Errorf("%s: container name %q: %v", w.name, c.Name, errs)
	}
	cs := c.SecurityContext
	if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
		cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
		cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s: container security context %+v, want no privilege escalation, a read-only root, capabilities dropped", w.name, cs)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := c.Resources.Requests[r]
		lim, okLim := c.Resources.Limits[r]
		if !okReq || !okLim || req.Cmp(lim) > 0 {
			t.Errorf("%s: %s request %v, limit %v: want both, request ≤ limit", w.name, r, c.Resources.Requests[r], c.Resources.Limits[r])
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if ref == nil {
			t.Errorf("%s: $%s comes from neither a value nor a Secret", w.name, e.Name)
			continue
		}
		if s, ok := b.secrets[ref.Name]; !ok {
			t.Errorf("%s: $%s: Secret %s is not in the base", w.name, e.Name, ref.Name)
		} else if _, ok := s.StringData[ref.Key]; !ok {
			t.Errorf("%s: $%s: Secret %s has no key %s", w.name, e.Name, ref.Name, ref.Key)
		}
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			t.Errorf("%s: envFrom other than a ConfigMap", w.name)
		} else if _, ok := b.configMaps[ef.ConfigMapRef.Name]; !ok {
			t.Errorf("%s: ConfigMap %s is not in the base", w.name, ef.ConfigMapRef.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		if !slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			t.Errorf("%s: mount of volume %s, which the pod does not have", w.name, m.Name)
		}
	}
	if !strings.HasPrefix(w.name, "Deployment ") {
		return 1
	}
	// A long-running gateway: its probes GET the paths gateway run serves
	// on a port the container declares. Liveness is /healthz only: on
	// /readyz a NATS or PostgreSQL outage would restart every pod, which
	// mends nothing.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
			t.Errorf("%s: port name %q: %v", w.name, p.Name, errs)
		}
		ports[p.Name] = p.ContainerPort
	}
	for name, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if pr == nil || pr.HTTPGet == nil {
			t.Errorf("%s: no %s probe by HTTP GET", w.name, name)
			continue
		}
		g := pr.HTTPGet
		if _, ok := ports[g.Port.StrVal]; !ok || g.Port.StrVal == "" {
			t.Errorf("%s: %s probe on port %s, not a port the container names", w.name, name, g.Port.String())
		}
		want := []string{"/healthz", "/readyz"}
		if name != "readiness" {
			want = want[:1]
		}
		if !slices.Contains(want, g.Path) {
			t.Errorf("%s: %s probe GETs %s, want one of %q", w.name, name, g.Path, want)
		}
	}
	// The declared ports are the ones the command line listens on.
	for flagName, port := range map[string]string{"metrics-addr": "metrics", "admin-addr": "admin"} {
		addr := flagValue(c.Args, flagName)
		n, declared := ports[port]
		if addr == "" {
			if declared {
				t.Errorf("%s: port %s declared, no --%s", w.name, port, flagName)
			}
			continue
		}
		_, p, err := net.SplitHostPort(addr)
		if err != nil || !declared || p != fmt.Sprint(n) {
			t.Errorf("%s: --%s %s, but port %s is %d (declared: %v)", w.name, flagName, addr, port, n, declared)
		}
	}
	return 1
}

// podsOf returns the Deployments whose pods sel matches.
func podsOf(b *base, sel labels.Selector) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range b.deployments {
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, d)
		}
	}
	return out
}

func checkService(t *testing.T, b *base, s *corev1.Service) {
	t.Helper()
	if len(s.Spec.Selector) == 0 {
		t.Errorf("Service %s selects nothing", s.Name)
		return
	}
	sel := labels.SelectorFromSet(s.Spec.Selector)
	ds := podsOf(b, sel)
	if len(ds) == 0 {
		t.Errorf("Service %s selects no Deployment's pods", s.Name)
	}
	for _, w := range b.workloads() {
		if strings.HasPrefix(w.name, "Job ") && sel.Matches(labels.Set(w.pod.Labels)) {
			t.Errorf("Service %s selects the pods of %s", s.Name, w.name)
		}
	}
	for _, p := range s.Spec.Ports {
		for _, d := range ds {
			c := d.Spec.Template.Spec.Containers[0]
			if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.TargetPort.StrVal }) {
				t.Errorf("Service %s port %s: target %s is not a port of Deployment %s", s.Name, p.Name, p.TargetPort.String(), d.Name)
			}
		}
	}
}

func checkServiceMonitor(t *testing.T, b *base, m *monitoringv1.ServiceMonitor) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var svcs []*corev1.Service
	for _, s := range b.services {
		if sel.Matches(labels.Set(s.Labels)) {
			svcs = append(svcs, s)
		}
	}
	if len(svcs) != 1 {
		t.Fatalf("ServiceMonitor %s selects %d Services, want 1", m.Name, len(svcs))
	}
	// Every gateway pod is scraped: the relay's and each adapter's.
	if got := podsOf(b, labels.SelectorFromSet(svcs[0].Spec.Selector)); len(got) != len(b.deployments) {
		t.Errorf("ServiceMonitor %s reaches %d of the %d Deployments", m.Name, len(got), len(b.deployments))
	}
	if len(m.Spec.Endpoints) == 0 {
		t.Errorf("ServiceMonitor %s has no endpoints", m.Name)
	}
	for _, e := range m.Spec.Endpoints {
		if !slices.ContainsFunc(svcs[0].Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port }) || e.Path != "/metrics" {
			t.Errorf("ServiceMonitor %s endpoint port %q path %q: want a port of Service %s and /metrics", m.Name, e.Port, e.Path, svcs[0].Name)
		}
	}
}

// Every gateway container's command line and environment (its ConfigMaps
// and Secrets, placeholders in) are ones the gateway built from this tree
// accepts: each GATEWAY_* variable is a gateway run flag's, and gateway run
// --print-config with them exits 0 and shows each variable's value. Each
// gateway run pod's terminationGracePeriodSeconds covers its stop bound
// (checkStopGrace).
func TestKubernetesGatewayFlags(t *testing.T) {
	t.Parallel()
	b := render(t)
	byEnv := runFlags(t)
	containers, vars := 0, 0
	for _, w := range b.workloads() {
		for _, c := range w.pod.Spec.Containers {
			containers++
			env := containerEnv(b, c)
			if len(c.Command) > 0 || len(c.Args) == 0 {
				t.Errorf("%s: command %q args %q: want the image's entrypoint with a gateway command line", w.name, c.Command, c.Args)
				continue
			}
			vars += checkGatewayEnv(t, w.name, byEnv, c.Args, env)
			if c.Args[0] == "run" {
				// Kubernetes' default grace is 30 s.
				grace := 30 * time.Second
				if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
					grace = time.Duration(*g) * time.Second
				}
				bound := checkStopGrace(t, w.name, c.Args, env, grace, "terminationGracePeriodSeconds")
				t.Logf("%s: terminationGracePeriodSeconds %v, stop bound %v", w.name, grace, bound)
			}
		}
	}
	t.Logf("%d gateway containers, %d GATEWAY_* variables checked", containers, vars)
	if containers == 0 || vars == 0 {
		t.Fatal("nothing checked")
	}
}

// containerEnv is a container's environment: its ConfigMaps' data and its
// variables, those from a Secret with the base's placeholder values.
func containerEnv(b *base, c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil && b.configMaps[ef.ConfigMapRef.Name] != nil {
			for k, v := range b.configMaps[ef.ConfigMapRef.Name].Data {
				env[k] = v
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil && b.secrets[e.ValueFrom.SecretKeyRef.Name] != nil:
			env[e.Name] = b.secrets[e.ValueFrom.SecretKeyRef.Name].StringData[e.ValueFrom.SecretKeyRef.Key]
		}
	}
	return env
}

// generatedRuleHeader heads deploy/kubernetes/prometheusrule.yaml.
const generatedRuleHeader = `# The alert rules of deploy/prometheus/alerts.yml as a Prometheus Operator
# PrometheusRule. Generated: do not edit; change alerts.yml, then
#   cd deploy/validate && go test -run TestPrometheusRuleIsAlertsYml -update
`

// The PrometheusRule holds the rules of deploy/prometheus/alerts.yml, the
// same groups and rules field by field (both decoded strictly into the
// Prometheus Operator's types). -update writes it from alerts.yml.
func TestPrometheusRuleIsAlertsYml(t *testing.T) {
	raw, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(raw, &want); err != nil {
		t.Fatalf("alerts.yml as a PrometheusRule's spec: %v", err)
	}
	path := filepath.Join(kustomizeDir, "prometheusrule.yaml")
	if *update {
		var spec map[string]any
		if err := yaml.Unmarshal(raw, &spec); err != nil {
			t.Fatal(err)
		}
		out, err := yaml.Marshal(map[string]any{
			"apiVersion": "monitoring.coreos.com/v1",
			"kind":       "PrometheusRule",
			"metadata": map[string]any{
				"name":   "fencegate",
				"labels": map[string]string{"app.kubernetes.io/name": "fencegate"},
			},
			"spec": spec,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append([]byte(generatedRuleHeader), out...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := decodeStrict(newScheme(t), b)
	if err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	rule, ok := obj.(*monitoringv1.PrometheusRule)
	if !ok {
		t.Fatalf("prometheusrule.yaml holds a %T", obj)
	}
	rules := 0
	for _, g := range want.Groups {
		rules += len(g.Rules)
	}
	if rules == 0 {
		t.Fatal("alerts.yml has no rules")
	}
	if !reflect.DeepEqual(rule.Spec, want) {
		got, _ := yaml.Marshal(rule.Spec)
		exp, _ := yaml.Marshal(want)
		t.Fatalf("prometheusrule.yaml's rules differ from alerts.yml's (regenerate: go test -run TestPrometheusRuleIsAlertsYml -update):\n--- prometheusrule.yaml\n%s\n--- alerts.yml\n%s", got, exp)
	}
	t.Logf("%d groups, %d rules, equal to alerts.yml's", len(want.Groups), rules)
}
