// Package kubernetes holds csid's Kubernetes manifests (a kustomize base, an
// overlay for a single-node cluster on the local backend, a component for
// the controller's state on a PVC, and examples). Its test renders them the
// way `kubectl apply -k` does, decodes every object strictly into the
// Kubernetes API types (and the snapshot kinds into external-snapshotter's
// types of the release the docs install), and checks what no schema can:
// that csid and its sidecars meet on the same socket, that kubelet is told
// where that socket is on the host, that names, ports, users and flags agree
// across objects.
package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/driver"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"golang.org/x/mod/modfile"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// defaultDriverName is the default of `csid serve --driver-name`.
const defaultDriverName = driver.DefaultName

const (
	namespace      = "csid"
	kubeletRoot    = "/var/lib/kubelet"
	registryPath   = "/var/lib/kubelet/plugins_registry"
	controllerName = "csid-controller"
	nodeName       = "csid-node"
	csidContainer  = "csid"
	sigStorage     = "registry.k8s.io/sig-storage/"
)

// Sidecar images, by repository.
const (
	provisionerImage = sigStorage + "csi-provisioner"
	attacherImage    = sigStorage + "csi-attacher"
	resizerImage     = sigStorage + "csi-resizer"
	registrarImage   = sigStorage + "csi-node-driver-registrar"
	livenessImage    = sigStorage + "livenessprobe"
	snapshotterImage = sigStorage + "csi-snapshotter"
)

const (
	// snapshotGroup is the API group of VolumeSnapshots and their classes.
	snapshotGroup = "snapshot.storage.k8s.io"
	// groupSnapshotGate is csi-snapshotter's feature gate for
	// VolumeGroupSnapshots, on by default since v8.6.
	groupSnapshotGate = "CSIVolumeGroupSnapshot"
	// snapshotClientModule holds the snapshot API types this test decodes
	// with; its version is the external-snapshotter release the manifests
	// and docs/deploy.md pin.
	snapshotClientModule = "github.com/kubernetes-csi/external-snapshotter/client/v8"
)

// reporter is what the checks report to: *testing.T, or a collector when a
// test breaks a manifest on purpose and expects the checks to notice.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// bundle is one rendered kustomization, decoded.
type bundle struct {
	name string

	namespaces          []*corev1.Namespace
	configMaps          []*corev1.ConfigMap
	serviceAccounts     []*corev1.ServiceAccount
	csiDrivers          []*storagev1.CSIDriver
	storageClasses      []*storagev1.StorageClass
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	roles               []*rbacv1.Role
	roleBindings        []*rbacv1.RoleBinding
	statefulSets        []*appsv1.StatefulSet
	daemonSets          []*appsv1.DaemonSet
	deployments         []*appsv1.Deployment
	pods                []*corev1.Pod
	claims              []*corev1.PersistentVolumeClaim
	snapshotClasses     []*snapshotv1.VolumeSnapshotClass
	snapshots           []*snapshotv1.VolumeSnapshot
}

// decode strictly decodes one object (YAML or JSON) into its API type and
// files it in b, as the API server does: field names are case-sensitive, and
// unknown fields, duplicate fields and kinds the test has no type for are
// errors.
func (b *bundle) decode(doc []byte) error {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return err
	}
	into := func(obj any, add func()) error {
		// sigs.k8s.io/yaml's own strict decoding matches field names as
		// encoding/json does, ignoring case: "mountpropagation" would pass.
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return fmt.Errorf("%s %s: %w", meta.APIVersion, meta.Kind, err)
		}
		strict, err := kjson.UnmarshalStrict(js, obj)
		if err = errors.Join(append([]error{err}, strict...)...); err != nil {
			return fmt.Errorf("%s %s: %w", meta.APIVersion, meta.Kind, err)
		}
		add()
		return nil
	}
	switch meta.APIVersion + " " + meta.Kind {
	case "v1 Namespace":
		o := new(corev1.Namespace)
		return into(o, func() { b.namespaces = append(b.namespaces, o) })
	case "v1 ConfigMap":
		o := new(corev1.ConfigMap)
		return into(o, func() { b.configMaps = append(b.configMaps, o) })
	case "v1 ServiceAccount":
		o := new(corev1.ServiceAccount)
		return into(o, func() { b.serviceAccounts = append(b.serviceAccounts, o) })
	case "v1 Pod":
		o := new(corev1.Pod)
		return into(o, func() { b.pods = append(b.pods, o) })
	case "v1 PersistentVolumeClaim":
		o := new(corev1.PersistentVolumeClaim)
		return into(o, func() { b.claims = append(b.claims, o) })
	case "storage.k8s.io/v1 CSIDriver":
		o := new(storagev1.CSIDriver)
		return into(o, func() { b.csiDrivers = append(b.csiDrivers, o) })
	case "storage.k8s.io/v1 StorageClass":
		o := new(storagev1.StorageClass)
		return into(o, func() { b.storageClasses = append(b.storageClasses, o) })
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		o := new(rbacv1.ClusterRole)
		return into(o, func() { b.clusterRoles = append(b.clusterRoles, o) })
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		o := new(rbacv1.ClusterRoleBinding)
		return into(o, func() { b.clusterRoleBindings = append(b.clusterRoleBindings, o) })
	case "rbac.authorization.k8s.io/v1 Role":
		o := new(rbacv1.Role)
		return into(o, func() { b.roles = append(b.roles, o) })
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		o := new(rbacv1.RoleBinding)
		return into(o, func() { b.roleBindings = append(b.roleBindings, o) })
	case "apps/v1 StatefulSet":
		o := new(appsv1.StatefulSet)
		return into(o, func() { b.statefulSets = append(b.statefulSets, o) })
	case "apps/v1 DaemonSet":
		o := new(appsv1.DaemonSet)
		return into(o, func() { b.daemonSets = append(b.daemonSets, o) })
	case "apps/v1 Deployment":
		o := new(appsv1.Deployment)
		return into(o, func() { b.deployments = append(b.deployments, o) })
	case snapshotGroup + "/v1 VolumeSnapshotClass":
		o := new(snapshotv1.VolumeSnapshotClass)
		return into(o, func() { b.snapshotClasses = append(b.snapshotClasses, o) })
	case snapshotGroup + "/v1 VolumeSnapshot":
		o := new(snapshotv1.VolumeSnapshot)
		return into(o, func() { b.snapshots = append(b.snapshots, o) })
	}
	return fmt.Errorf("%s %s: the test has no type for this kind; add one to bundle.decode", meta.APIVersion, meta.Kind)
}

// render builds the kustomization in dir as `kubectl apply -k dir` would and
// decodes every object.
func render(dir string) (*bundle, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	b := &bundle{name: dir}
	for _, r := range m.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", dir, r.CurId(), err)
		}
		if err := b.decode(doc); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
	}
	return b, nil
}

// readDocs decodes every YAML document of every .yaml file in dir.
func readDocs(dir string) (*bundle, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no .yaml files in %s", dir)
	}
	b := &bundle{name: dir}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			if err := b.decode(doc); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	return b, nil
}

// stripComments drops whole-line comments, to tell an empty document from
// one with content.
func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

// --- the checks -------------------------------------------------------------

// checkAll runs every check that holds for any deployment of csid.
func checkAll(r reporter, b *bundle) {
	r.Helper()
	checkObjects(r, b)
	driver := checkCSIDriver(r, b)
	checkStorageClass(r, b, driver)
	ctrl := onlyStatefulSet(r, b, controllerName)
	node := onlyDaemonSet(r, b, nodeName)
	checkSnapshotClass(r, b, driver, ctrl, takesSnapshots(ctrl))
	if ctrl == nil || node == nil {
		return
	}
	ctrlPod, nodePod := &ctrl.Spec.Template.Spec, &node.Spec.Template.Spec
	claimVolumes := map[string]bool{}
	for _, c := range ctrl.Spec.VolumeClaimTemplates {
		claimVolumes[c.Name] = true
	}

	for _, p := range []struct {
		what   string
		spec   *corev1.PodSpec
		claims map[string]bool
	}{{"controller", ctrlPod, claimVolumes}, {"node", nodePod, nil}} {
		checkPodSpec(r, b.name+": "+p.what, p.spec, p.claims)
	}

	checkController(r, b, ctrl, driver)
	checkNode(r, b, node, driver)
	checkPorts(r, b.name, map[string]*corev1.PodSpec{"controller": ctrlPod, "node": nodePod})
	checkRBAC(r, b, ctrlPod, nodePod)
}

func checkObjects(r reporter, b *bundle) {
	r.Helper()
	if len(b.namespaces) != 1 || b.namespaces[0].Name != namespace {
		r.Errorf("%s: want exactly the Namespace %q, have %d namespaces", b.name, namespace, len(b.namespaces))
	} else if got := b.namespaces[0].Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
		r.Errorf("%s: Namespace %s enforces Pod Security %q; the node plugin is privileged and needs \"privileged\"", b.name, namespace, got)
	}
	namespaced := map[string]string{}
	for _, o := range b.serviceAccounts {
		namespaced["ServiceAccount/"+o.Name] = o.Namespace
	}
	for _, o := range b.roles {
		namespaced["Role/"+o.Name] = o.Namespace
	}
	for _, o := range b.roleBindings {
		namespaced["RoleBinding/"+o.Name] = o.Namespace
	}
	for _, o := range b.statefulSets {
		namespaced["StatefulSet/"+o.Name] = o.Namespace
	}
	for _, o := range b.daemonSets {
		namespaced["DaemonSet/"+o.Name] = o.Namespace
	}
	for what, ns := range namespaced {
		if ns != namespace {
			r.Errorf("%s: %s is in namespace %q, want %q", b.name, what, ns, namespace)
		}
	}
}

func checkCSIDriver(r reporter, b *bundle) *storagev1.CSIDriver {
	r.Helper()
	if len(b.csiDrivers) != 1 {
		r.Errorf("%s: want one CSIDriver, have %d", b.name, len(b.csiDrivers))
		return nil
	}
	d := b.csiDrivers[0]
	if d.Name != defaultDriverName {
		r.Errorf("%s: CSIDriver %q, want csid's default driver name %q", b.name, d.Name, defaultDriverName)
	}
	s := d.Spec
	if s.AttachRequired == nil || !*s.AttachRequired {
		r.Errorf("%s: CSIDriver attachRequired must be true (csid attaches in ControllerPublishVolume)", b.name)
	}
	if s.PodInfoOnMount == nil || *s.PodInfoOnMount {
		r.Errorf("%s: CSIDriver podInfoOnMount must be set to false", b.name)
	}
	if s.FSGroupPolicy == nil || *s.FSGroupPolicy != storagev1.FileFSGroupPolicy {
		r.Errorf("%s: CSIDriver fsGroupPolicy must be File", b.name)
	}
	if !slices.Equal(s.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
		r.Errorf("%s: CSIDriver volumeLifecycleModes %v, want [Persistent]", b.name, s.VolumeLifecycleModes)
	}
	return d
}

func checkStorageClass(r reporter, b *bundle, driver *storagev1.CSIDriver) {
	r.Helper()
	if len(b.storageClasses) != 1 {
		r.Errorf("%s: want one StorageClass, have %d", b.name, len(b.storageClasses))
		return
	}
	sc := b.storageClasses[0]
	if driver != nil && sc.Provisioner != driver.Name {
		r.Errorf("%s: StorageClass %s provisioner %q, want the CSIDriver's name %q", b.name, sc.Name, sc.Provisioner, driver.Name)
	}
	if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
		r.Errorf("%s: StorageClass %s must allow volume expansion", b.name, sc.Name)
	}
	if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		r.Errorf("%s: StorageClass %s must bind WaitForFirstConsumer (disks are zonal, and local disks are on one machine)", b.name, sc.Name)
	}
}

// checkSnapshotClass: beside csid's StorageClass, one VolumeSnapshotClass of
// the same driver that deletes a snapshot with its VolumeSnapshot, and a
// csi-snapshotter in the controller to serve it (a class nothing serves
// leaves every VolumeSnapshot of it pending).
func checkSnapshotClass(r reporter, b *bundle, driver *storagev1.CSIDriver, ctrl *appsv1.StatefulSet, snapshots bool) {
	r.Helper()
	if len(b.storageClasses) == 0 && len(b.snapshotClasses) == 0 {
		return
	}
	if !snapshots {
		for _, c := range b.snapshotClasses {
			r.Errorf("%s: VolumeSnapshotClass %s, but csid's backend here takes no snapshots: every VolumeSnapshot of it would fail", b.name, c.Name)
		}
		return
	}
	if len(b.snapshotClasses) != 1 {
		r.Errorf("%s: want one VolumeSnapshotClass beside the StorageClass, have %d", b.name, len(b.snapshotClasses))
		return
	}
	c := b.snapshotClasses[0]
	if driver != nil && c.Driver != driver.Name {
		r.Errorf("%s: VolumeSnapshotClass %s driver %q, want the CSIDriver's name %q", b.name, c.Name, c.Driver, driver.Name)
	}
	if c.DeletionPolicy != snapshotv1.VolumeSnapshotContentDelete {
		r.Errorf("%s: VolumeSnapshotClass %s deletionPolicy %q, want Delete (as the StorageClass's reclaimPolicy)", b.name, c.Name, c.DeletionPolicy)
	}
	if ctrl != nil && len(byImage(&ctrl.Spec.Template.Spec, snapshotterImage)) == 0 {
		r.Errorf("%s: VolumeSnapshotClass %s, but the controller runs no csi-snapshotter: no snapshot of it would ever be taken", b.name, c.Name)
	}
}

// takesSnapshots says whether the controller's backend takes snapshots
// (local and fake do; yandex does not yet, docs/cloud.md).
func takesSnapshots(ctrl *appsv1.StatefulSet) bool {
	if ctrl == nil {
		return true
	}
	c := findContainer(&ctrl.Spec.Template.Spec, csidContainer)
	return c == nil || firstValue(parseFlags(c.Args), "cloud") != "yandex"
}

func onlyStatefulSet(r reporter, b *bundle, name string) *appsv1.StatefulSet {
	r.Helper()
	if len(b.statefulSets) != 1 || b.statefulSets[0].Name != name {
		r.Errorf("%s: want exactly the StatefulSet %s, have %d", b.name, name, len(b.statefulSets))
		return nil
	}
	s := b.statefulSets[0]
	if s.Spec.Replicas == nil || *s.Spec.Replicas != 1 {
		r.Errorf("%s: StatefulSet %s must have exactly 1 replica (csid's state file has one writer)", b.name, name)
	}
	return s
}

func onlyDaemonSet(r reporter, b *bundle, name string) *appsv1.DaemonSet {
	r.Helper()
	if len(b.daemonSets) != 1 || b.daemonSets[0].Name != name {
		r.Errorf("%s: want exactly the DaemonSet %s, have %d", b.name, name, len(b.daemonSets))
		return nil
	}
	return b.daemonSets[0]
}

// checkPodSpec checks what holds for the containers of any pod: images
// pinned, resources bounded, mounts of volumes that exist, probes on ports
// that exist, and two rules the API server enforces but no decoder does.
func checkPodSpec(r reporter, where string, spec *corev1.PodSpec, claimVolumes map[string]bool) {
	r.Helper()
	volumes := map[string]bool{}
	for name := range claimVolumes {
		volumes[name] = true
	}
	for _, v := range spec.Volumes {
		if volumes[v.Name] {
			r.Errorf("%s: volume %q defined twice", where, v.Name)
		}
		volumes[v.Name] = true
	}
	portNames := map[string]string{}
	for _, c := range allContainers(spec) {
		at := where + ": container " + c.Name
		checkImage(r, at, c.Image)
		checkResources(r, at, c.Resources)
		privileged := isPrivileged(c)
		if privileged && c.SecurityContext.AllowPrivilegeEscalation != nil && !*c.SecurityContext.AllowPrivilegeEscalation {
			r.Errorf("%s: privileged with allowPrivilegeEscalation false (the API server rejects this)", at)
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				r.Errorf("%s: mounts volume %q, which the pod does not define", at, m.Name)
			}
			if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional && !privileged {
				r.Errorf("%s: Bidirectional mount of %s in a container that is not privileged (the API server rejects this)", at, m.MountPath)
			}
		}
		ports := map[string]bool{}
		for _, p := range c.Ports {
			if p.Name == "" {
				continue
			}
			if len(p.Name) > 15 {
				r.Errorf("%s: port name %q longer than 15 characters", at, p.Name)
			}
			if other, dup := portNames[p.Name]; dup {
				r.Errorf("%s: port name %q also used by container %s", at, p.Name, other)
			}
			portNames[p.Name] = c.Name
			ports[p.Name] = true
		}
		for kind, probe := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if probe == nil || probe.HTTPGet == nil {
				continue
			}
			if p := probe.HTTPGet.Port; p.StrVal != "" && !ports[p.StrVal] {
				r.Errorf("%s: %s probe on port %q, which the container does not declare", at, kind, p.StrVal)
			}
		}
	}
}

func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var cs []*corev1.Container
	for i := range spec.InitContainers {
		cs = append(cs, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		cs = append(cs, &spec.Containers[i])
	}
	return cs
}

// checkImage: a registry path with a tag other than "latest", or a digest.
func checkImage(r reporter, at, image string) {
	r.Helper()
	if name, digest, ok := strings.Cut(image, "@"); ok {
		if !strings.HasPrefix(digest, "sha256:") || len(digest) != len("sha256:")+64 {
			r.Errorf("%s: image %q has a malformed digest", at, image)
		}
		image = name
		if !strings.Contains(path.Base(name), ":") {
			return // pinned by digest alone
		}
	}
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		r.Errorf("%s: image %q has no tag: pin it by tag or digest", at, image)
		return
	}
	if tag := image[i+1:]; tag == "" || tag == "latest" || tag == "canary" {
		r.Errorf("%s: image %q is not pinned (tag %q)", at, image, tag)
	}
}

func checkResources(r reporter, at string, res corev1.ResourceRequirements) {
	r.Helper()
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := res.Requests[name]
		lim, hasLim := res.Limits[name]
		if !hasReq || !hasLim {
			r.Errorf("%s: needs both a request and a limit for %s", at, name)
			continue
		}
		if req.Cmp(lim) > 0 {
			r.Errorf("%s: %s request %s above its limit %s", at, name, req.String(), lim.String())
		}
		if lim.Cmp(resource.MustParse("0")) <= 0 {
			r.Errorf("%s: %s limit %s", at, name, lim.String())
		}
	}
}

// flags parses "--name=value" and "--name" arguments (the form every
// manifest here uses); positional arguments come back in args.
type flags struct {
	values map[string][]string
	args   []string
}

func parseFlags(argv []string) flags {
	f := flags{values: map[string][]string{}}
	for _, a := range argv {
		if !strings.HasPrefix(a, "-") {
			f.args = append(f.args, a)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			value = "true"
		}
		f.values[name] = append(f.values[name], value)
	}
	return f
}

// get returns the flag's one value, reporting when it is missing or repeated.
func (f flags) get(r reporter, at, name string) (string, bool) {
	r.Helper()
	v := f.values[name]
	switch len(v) {
	case 0:
		r.Errorf("%s: flag --%s missing", at, name)
		return "", false
	case 1:
		return v[0], true
	}
	r.Errorf("%s: flag --%s given %d times", at, name, len(v))
	return "", false
}

func findContainer(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// byImage returns the containers whose image is repo (any tag or digest).
func byImage(spec *corev1.PodSpec, repo string) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.Containers {
		img := spec.Containers[i].Image
		img, _, _ = strings.Cut(img, "@")
		if j := strings.LastIndex(img, ":"); j > 0 && !strings.Contains(img[j:], "/") {
			img = img[:j]
		}
		if img == repo {
			out = append(out, &spec.Containers[i])
		}
	}
	return out
}

func volumeByName(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// mountFor returns the mount of c under which p lies (the longest match).
func mountFor(c *corev1.Container, p string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		mp := strings.TrimSuffix(m.MountPath, "/")
		if (p == mp || strings.HasPrefix(p, mp+"/")) && (best == nil || len(mp) > len(best.MountPath)) {
			best = m
		}
	}
	return best
}

// socketPath turns a CSI endpoint (unix:///path or /path) into a path.
func socketPath(endpoint string) (string, error) {
	if strings.HasPrefix(endpoint, "/") {
		return path.Clean(endpoint), nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", err
	}
	if u.Scheme != "unix" || u.Host != "" || !strings.HasPrefix(u.Path, "/") {
		return "", fmt.Errorf("endpoint %q is neither unix:///absolute/path nor /absolute/path", endpoint)
	}
	return path.Clean(u.Path), nil
}

// runAs is a container's effective user: its own runAsUser, else the pod's.
func runAs(spec *corev1.PodSpec, c *corev1.Container) *int64 {
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return c.SecurityContext.RunAsUser
	}
	if spec.SecurityContext != nil {
		return spec.SecurityContext.RunAsUser
	}
	return nil
}

func isPrivileged(c *corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
}

// csidFlags finds the csid container and parses its arguments.
func csidFlags(r reporter, at string, spec *corev1.PodSpec, mode string, driver *storagev1.CSIDriver) (*corev1.Container, flags, bool) {
	r.Helper()
	c := findContainer(spec, csidContainer)
	if c == nil {
		r.Errorf("%s: no container named %q", at, csidContainer)
		return nil, flags{}, false
	}
	at += ": csid"
	f := parseFlags(c.Args)
	if len(c.Command) != 0 {
		r.Errorf("%s: command overridden (%q); the image's entrypoint is csid", at, c.Command)
	}
	if !slices.Equal(f.args, []string{"serve"}) {
		r.Errorf("%s: positional arguments %q, want [serve]", at, f.args)
	}
	if m, ok := f.get(r, at, "mode"); ok && m != mode {
		r.Errorf("%s: --mode=%s, want %s", at, m, mode)
	}
	if v := f.values["driver-name"]; len(v) > 0 && driver != nil && v[0] != driver.Name {
		r.Errorf("%s: --driver-name=%s but the CSIDriver is %q", at, v[0], driver.Name)
	}
	if v := f.values["node-id"]; len(v) == 1 && strings.Contains(v[0], "$(") {
		name := strings.TrimSuffix(strings.TrimPrefix(v[0], "$("), ")")
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name }) {
			r.Errorf("%s: --node-id=%s refers to an environment variable the container does not set", at, v[0])
		}
	}
	// The state directory must be a volume, so that the state file outlives
	// the container and `kubectl exec ... csid inspect` finds the admin
	// socket in it.
	if dir, ok := f.get(r, at, "state-dir"); ok {
		m := mountFor(c, path.Clean(dir))
		if m == nil || path.Clean(m.MountPath) != path.Clean(dir) {
			r.Errorf("%s: --state-dir=%s is not a volume mount of its own", at, dir)
		} else if v := volumeByName(spec, m.Name); v != nil && v.EmptyDir != nil {
			r.Errorf("%s: --state-dir=%s is on an emptyDir: the state would not survive the pod", at, dir)
		}
		if v := f.values["admin-socket"]; len(v) == 1 && !strings.HasPrefix(path.Clean(v[0]), path.Clean(dir)+"/") {
			r.Errorf("%s: --admin-socket=%s is outside --state-dir=%s", at, v[0], dir)
		}
	}
	return c, f, true
}

// checkSocket checks that every sidecar that dials csid names csid's
// --endpoint, through the same volume mounted at the same path, and runs as
// the socket's owner. It returns the socket's volume and its path inside
// that volume.
func checkSocket(r reporter, at string, spec *corev1.PodSpec, csid *corev1.Container, f flags, sidecars []string) (vol *corev1.Volume, rel string) {
	r.Helper()
	endpoint, ok := f.get(r, at+": csid", "endpoint")
	if !ok {
		return nil, ""
	}
	sock, err := socketPath(endpoint)
	if err != nil {
		r.Errorf("%s: csid --endpoint: %v", at, err)
		return nil, ""
	}
	m := mountFor(csid, sock)
	if m == nil {
		r.Errorf("%s: csid's socket %s is on no volume: its sidecars cannot reach it", at, sock)
		return nil, ""
	}
	vol = volumeByName(spec, m.Name)
	rel = strings.TrimPrefix(strings.TrimPrefix(sock, path.Clean(m.MountPath)), "/")
	for _, repo := range sidecars {
		cs := byImage(spec, repo)
		if len(cs) != 1 {
			r.Errorf("%s: want one %s container, have %d", at, repo, len(cs))
			continue
		}
		c := cs[0]
		sf := parseFlags(c.Args)
		addr, ok := sf.get(r, at+": "+c.Name, "csi-address")
		if !ok {
			continue
		}
		p, err := socketPath(addr)
		if err != nil {
			r.Errorf("%s: %s --csi-address: %v", at, c.Name, err)
			continue
		}
		if p != sock {
			r.Errorf("%s: %s --csi-address=%s, but csid listens on %s", at, c.Name, addr, sock)
			continue
		}
		sm := mountFor(c, p)
		if sm == nil || sm.Name != m.Name || path.Clean(sm.MountPath) != path.Clean(m.MountPath) {
			r.Errorf("%s: %s reaches %s through %v, csid through volume %q at %s", at, c.Name, p, sm, m.Name, m.MountPath)
		}
		// csid creates the socket with its umask (0755): only its owner
		// can connect.
		cu, su := runAs(spec, csid), runAs(spec, c)
		switch {
		case cu == nil || su == nil:
			r.Errorf("%s: %s and csid must both have an explicit runAsUser (the socket's owner decides who may connect)", at, c.Name)
		case *cu != *su:
			r.Errorf("%s: %s runs as user %d but csid, which owns the socket, as %d", at, c.Name, *su, *cu)
		}
	}
	return vol, rel
}

// livenessPort checks the livenessprobe sidecar and the csid probes wired
// to it, and returns its port.
func livenessPort(r reporter, at string, spec *corev1.PodSpec, csid *corev1.Container) int {
	r.Helper()
	cs := byImage(spec, livenessImage)
	if len(cs) != 1 {
		return 0 // reported by checkSocket
	}
	v, ok := parseFlags(cs[0].Args).get(r, at+": "+cs[0].Name, "health-port")
	if !ok {
		return 0
	}
	port, err := strconv.Atoi(v)
	if err != nil {
		r.Errorf("%s: livenessprobe --health-port=%s: %v", at, v, err)
		return 0
	}
	if csid.LivenessProbe == nil || csid.LivenessProbe.HTTPGet == nil {
		r.Errorf("%s: csid has no HTTP liveness probe", at)
		return port
	}
	for kind, p := range map[string]*corev1.Probe{"liveness": csid.LivenessProbe, "startup": csid.StartupProbe} {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || resolvePort(csid, p.HTTPGet.Port.StrVal, p.HTTPGet.Port.IntValue()) != port {
			r.Errorf("%s: csid's %s probe must be GET /healthz on the livenessprobe port %d", at, kind, port)
		}
	}
	return port
}

func resolvePort(c *corev1.Container, name string, number int) int {
	if name == "" {
		return number
	}
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	return -1
}

func checkController(r reporter, b *bundle, s *appsv1.StatefulSet, driver *storagev1.CSIDriver) {
	r.Helper()
	at := b.name + ": StatefulSet " + s.Name
	spec := &s.Spec.Template.Spec
	if spec.PriorityClassName != "system-cluster-critical" {
		r.Errorf("%s: priorityClassName %q, want system-cluster-critical", at, spec.PriorityClassName)
	}
	if spec.HostNetwork {
		r.Errorf("%s: the controller needs no host network", at)
	}
	csid, f, ok := csidFlags(r, at, spec, "controller", driver)
	if !ok {
		return
	}
	sidecars := []string{provisionerImage, attacherImage, resizerImage, livenessImage}
	if takesSnapshots(s) {
		sidecars = append(sidecars, snapshotterImage)
	} else if len(byImage(spec, snapshotterImage)) > 0 {
		r.Errorf("%s: csi-snapshotter, but csid's backend here takes no snapshots: the sidecar exits at start", at)
	}
	vol, _ := checkSocket(r, at, spec, csid, f, sidecars)
	if vol != nil && vol.EmptyDir == nil {
		r.Errorf("%s: the controller's socket volume %q should be an emptyDir (nothing outside the pod dials it)", at, vol.Name)
	}
	livenessPort(r, at, spec, csid)

	if cs := byImage(spec, provisionerImage); len(cs) == 1 {
		pf := parseFlags(cs[0].Args)
		if !slices.ContainsFunc(pf.values["feature-gates"], func(v string) bool {
			return slices.Contains(strings.Split(v, ","), "Topology=true")
		}) {
			r.Errorf("%s: csi-provisioner needs --feature-gates=Topology=true (csid reports topology)", at)
		}
		if v := pf.values["extra-create-metadata"]; len(v) != 1 || v[0] != "true" {
			r.Errorf("%s: csi-provisioner needs --extra-create-metadata", at)
		}
	}
	if cs := byImage(spec, resizerImage); len(cs) == 1 {
		rf := parseFlags(cs[0].Args)
		// design.md, "Deferred offline resize": with the resizer's default
		// in-use handling an offline expansion can stall forever.
		if v, ok := rf.get(r, at+": csi-resizer", "handle-volume-inuse-error"); ok && v != "false" {
			r.Errorf("%s: csi-resizer --handle-volume-inuse-error=%s, want false", at, v)
		}
		if v, ok := rf.get(r, at+": csi-resizer", "retry-interval-max"); ok && v != "30s" {
			r.Errorf("%s: csi-resizer --retry-interval-max=%s, want 30s", at, v)
		}
	}
	// Leader election and the sidecars' liveness on it.
	for _, repo := range []string{provisionerImage, attacherImage, resizerImage, snapshotterImage} {
		for _, c := range byImage(spec, repo) {
			le := parseFlags(c.Args).values["leader-election"]
			if len(le) == 1 && le[0] == "true" && (c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil ||
				c.LivenessProbe.HTTPGet.Path != "/healthz/leader-election") {
				r.Errorf("%s: %s elects a leader but has no liveness probe on /healthz/leader-election", at, c.Name)
			}
		}
	}
	// The state directory is a hostPath (base, overlay) or a claim.
	if m := mountFor(csid, path.Clean(firstValue(f, "state-dir"))); m != nil {
		v := volumeByName(spec, m.Name)
		claim := slices.ContainsFunc(s.Spec.VolumeClaimTemplates, func(c corev1.PersistentVolumeClaim) bool { return c.Name == m.Name })
		switch {
		case v != nil && v.HostPath != nil, v == nil && claim:
		default:
			r.Errorf("%s: the controller's state volume %q is neither a hostPath nor a volumeClaimTemplate", at, m.Name)
		}
	}
}

func firstValue(f flags, name string) string {
	if v := f.values[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func checkNode(r reporter, b *bundle, d *appsv1.DaemonSet, driver *storagev1.CSIDriver) {
	r.Helper()
	at := b.name + ": DaemonSet " + d.Name
	spec := &d.Spec.Template.Spec
	if spec.PriorityClassName != "system-node-critical" {
		r.Errorf("%s: priorityClassName %q, want system-node-critical", at, spec.PriorityClassName)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(t corev1.Toleration) bool {
		return t.Operator == corev1.TolerationOpExists && t.Key == "" && t.Effect == ""
	}) {
		r.Errorf("%s: the node plugin must tolerate every taint (operator Exists, no key, no effect)", at)
	}
	csid, f, ok := csidFlags(r, at, spec, "node", driver)
	if !ok {
		return
	}
	if !isPrivileged(csid) {
		r.Errorf("%s: csid must be privileged on the node (loop devices, mkfs, mount)", at)
	}
	if u := runAs(spec, csid); u == nil || *u != 0 {
		r.Errorf("%s: csid must run as root on the node", at)
	}
	checkGracePeriod(r, at, spec, f)
	if firstValue(f, "cloud") == "yandex" {
		// The node id is the instance id, which csid reads from the
		// metadata service; the Kubernetes node name is not it.
		if v := f.values["node-id"]; len(v) > 0 {
			r.Errorf("%s: csid --node-id=%s: on Yandex the node id is the instance id, read from the metadata service; give no --node-id", at, v[0])
		}
	} else if id, ok := f.get(r, at+": csid", "node-id"); ok {
		name := strings.TrimSuffix(strings.TrimPrefix(id, "$("), ")")
		if !slices.ContainsFunc(csid.Env, func(e corev1.EnvVar) bool {
			return e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
		}) {
			r.Errorf("%s: csid --node-id=%s must come from the downward API's spec.nodeName", at, id)
		}
	}

	// kubelet's directory, at the same path, Bidirectional, and csid
	// confined to it.
	if v, ok := f.get(r, at+": csid", "kubelet-root"); ok && path.Clean(v) != kubeletRoot {
		r.Errorf("%s: csid --kubelet-root=%s, but kubelet's directory is %s", at, v, kubeletRoot)
	}
	km := mountFor(csid, kubeletRoot+"/pods")
	if km == nil || path.Clean(km.MountPath) != kubeletRoot {
		r.Errorf("%s: csid must mount the kubelet directory at %s", at, kubeletRoot)
	} else {
		if km.MountPropagation == nil || *km.MountPropagation != corev1.MountPropagationBidirectional {
			r.Errorf("%s: csid's mount of %s must be Bidirectional", at, kubeletRoot)
		}
		if v := volumeByName(spec, km.Name); v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != kubeletRoot {
			r.Errorf("%s: volume %q must be the host's %s", at, km.Name, kubeletRoot)
		}
	}
	if m := mountFor(csid, "/dev/loop0"); m == nil || path.Clean(m.MountPath) != "/dev" {
		r.Errorf("%s: csid must mount the host's /dev", at)
	} else if v := volumeByName(spec, m.Name); v == nil || v.HostPath == nil || v.HostPath.Path != "/dev" {
		r.Errorf("%s: csid's /dev must be the host's /dev", at)
	}
	if dir := firstValue(f, "state-dir"); dir != "" {
		if m := mountFor(csid, path.Clean(dir)); m != nil {
			if v := volumeByName(spec, m.Name); v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != "/var/lib/csid" {
				r.Errorf("%s: the node's state directory must be the host's /var/lib/csid", at)
			}
		}
	}

	// The socket: on the host where the registrar tells kubelet it is.
	vol, rel := checkSocket(r, at, spec, csid, f, []string{registrarImage, livenessImage})
	livenessPort(r, at, spec, csid)
	if vol == nil {
		return
	}
	pluginDir := path.Join(kubeletRoot, "plugins", defaultDriverName)
	if driver != nil {
		pluginDir = path.Join(kubeletRoot, "plugins", driver.Name)
	}
	if vol.HostPath == nil || path.Clean(vol.HostPath.Path) != pluginDir {
		r.Errorf("%s: csid's socket must be on a hostPath volume of %s, the driver's plugin directory", at, pluginDir)
		return
	}
	hostSock := path.Join(vol.HostPath.Path, rel)
	regs := byImage(spec, registrarImage)
	if len(regs) != 1 {
		return
	}
	reg := regs[0]
	rf := parseFlags(reg.Args)
	if p, ok := rf.get(r, at+": "+reg.Name, "kubelet-registration-path"); ok && path.Clean(p) != hostSock {
		r.Errorf("%s: node-driver-registrar --kubelet-registration-path=%s, but csid's socket is %s on the host", at, p, hostSock)
	}
	rm := mountFor(reg, "/registration/x")
	if rm == nil || path.Clean(rm.MountPath) != "/registration" {
		r.Errorf("%s: node-driver-registrar must mount kubelet's plugin registration directory at /registration", at)
	} else if v := volumeByName(spec, rm.Name); v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != registryPath {
		r.Errorf("%s: node-driver-registrar's /registration must be the host's %s", at, registryPath)
	}
}

// checkGracePeriod checks that kubelet gives the node plugin the time its
// shutdown may take (2x --shutdown-timeout, then --host-tool-grace for a
// resize2fs or e2fsck still running, which csid never kills) before it
// kills the container, host tools and all. The grace is asked for
// explicitly: its default is the binary's, not the manifest's.
func checkGracePeriod(r reporter, at string, spec *corev1.PodSpec, f flags) {
	r.Helper()
	duration := func(name string, def time.Duration) time.Duration {
		v := firstValue(f, name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			r.Errorf("%s: csid --%s=%s: %v", at, name, v, err)
		}
		return d
	}
	grace, ok := f.get(r, at+": csid", "host-tool-grace")
	if !ok {
		return
	}
	need := 2*duration("shutdown-timeout", app.DefaultShutdownTimeout) + duration("host-tool-grace", app.DefaultHostToolGrace)
	got := 30 * time.Second // Kubernetes' default
	if spec.TerminationGracePeriodSeconds != nil {
		got = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	}
	if got <= need {
		r.Errorf("%s: terminationGracePeriodSeconds %v, but csid's shutdown may take %v (--host-tool-grace=%s): "+
			"kubelet would kill a resize2fs csid waits for", at, got, need, grace)
	}
}

// checkPorts checks the ports the containers listen on: unique across the
// controller and node pods (they could then share a host network), and every
// declared container port is one that something in its pod listens on.
func checkPorts(r reporter, where string, pods map[string]*corev1.PodSpec) {
	r.Helper()
	owner := map[int]string{}
	for pod, spec := range pods {
		listening := map[int]bool{}
		for _, c := range spec.Containers {
			f := parseFlags(c.Args)
			for _, name := range []string{"health-port", "http-endpoint", "metrics-address"} {
				for _, v := range f.values[name] {
					if i := strings.LastIndex(v, ":"); i >= 0 {
						v = v[i+1:]
					}
					port, err := strconv.Atoi(v)
					if err != nil || port <= 0 || port > 65535 {
						r.Errorf("%s: %s/%s --%s=%s: not a port", where, pod, c.Name, name, v)
						continue
					}
					at := pod + "/" + c.Name
					if other, dup := owner[port]; dup {
						r.Errorf("%s: port %d used by both %s and %s", where, port, other, at)
					}
					owner[port] = at
					listening[port] = true
				}
			}
		}
		for _, c := range spec.Containers {
			for _, p := range c.Ports {
				if !listening[int(p.ContainerPort)] {
					r.Errorf("%s: %s/%s declares port %d (%s), on which nothing in the pod listens", where, pod, c.Name, p.ContainerPort, p.Name)
				}
			}
		}
		if c := findContainer(spec, csidContainer); c != nil && c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil {
			addr := firstValue(parseFlags(c.Args), "metrics-address")
			_, want, _ := strings.Cut(addr, ":")
			got := resolvePort(c, c.ReadinessProbe.HTTPGet.Port.StrVal, c.ReadinessProbe.HTTPGet.Port.IntValue())
			if strconv.Itoa(got) != want || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				r.Errorf("%s: %s/csid readiness probe must be GET /readyz on --metrics-address %s", where, pod, addr)
			}
		}
	}
}

// permission is one thing a sidecar must be allowed to do, for its own
// sake; the table is what each sidecar documents that csid needs.
type permission struct{ group, resource, verb string }

var required = map[string][]permission{
	provisionerImage: {
		{"", "persistentvolumes", "create"}, {"", "persistentvolumes", "delete"}, {"", "persistentvolumes", "patch"},
		{"", "persistentvolumeclaims", "update"}, {"storage.k8s.io", "storageclasses", "watch"},
		{"storage.k8s.io", "csinodes", "watch"}, {"", "nodes", "watch"}, {"storage.k8s.io", "volumeattachments", "watch"},
		{"", "events", "create"},
		// A claim restored from a snapshot: the provisioner reads the
		// VolumeSnapshot and its content for the snapshot's handle.
		{snapshotGroup, "volumesnapshots", "get"}, {snapshotGroup, "volumesnapshotcontents", "get"},
	},
	attacherImage: {
		{"", "persistentvolumes", "patch"}, {"storage.k8s.io", "csinodes", "watch"},
		{"storage.k8s.io", "volumeattachments", "patch"}, {"storage.k8s.io", "volumeattachments/status", "patch"},
	},
	resizerImage: {
		{"", "persistentvolumes", "patch"}, {"", "persistentvolumeclaims", "watch"},
		{"", "persistentvolumeclaims/status", "patch"}, {"", "events", "create"},
	},
	snapshotterImage: {
		{snapshotGroup, "volumesnapshotclasses", "watch"}, {snapshotGroup, "volumesnapshotclasses", "get"},
		{snapshotGroup, "volumesnapshotcontents", "watch"}, {snapshotGroup, "volumesnapshotcontents", "update"},
		{snapshotGroup, "volumesnapshotcontents", "patch"}, {snapshotGroup, "volumesnapshotcontents/status", "update"},
		{snapshotGroup, "volumesnapshotcontents/status", "patch"}, {"", "events", "create"}, {"", "events", "patch"},
	},
}

// groupSnapshotPerms is what csi-snapshotter needs on top when its
// VolumeGroupSnapshot gate is on: it then watches the group kinds and waits
// for those watches before it handles any snapshot, so without these rules
// it handles none.
var groupSnapshotPerms = []permission{
	{"groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "watch"},
	{"groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "watch"},
	{"groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "patch"},
	{"groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "patch"},
}

// groupSnapshotsOn tells whether csi-snapshotter's VolumeGroupSnapshot gate
// is on: unless --feature-gates turns it off, it is.
func groupSnapshotsOn(f flags) bool {
	on := true
	for _, v := range f.values["feature-gates"] {
		for _, kv := range strings.Split(v, ",") {
			if name, val, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && name == groupSnapshotGate {
				on = val != "false"
			}
		}
	}
	return on
}

var leaseVerbs = []string{"get", "create", "update"}

func checkRBAC(r reporter, b *bundle, ctrl, node *corev1.PodSpec) {
	r.Helper()
	at := b.name + ": RBAC"
	sas := map[string]*corev1.ServiceAccount{}
	for _, sa := range b.serviceAccounts {
		sas[sa.Name] = sa
	}
	for _, p := range []struct {
		what string
		spec *corev1.PodSpec
	}{{"controller", ctrl}, {"node", node}} {
		if sas[p.spec.ServiceAccountName] == nil {
			r.Errorf("%s: the %s pod's ServiceAccount %q is not defined", at, p.what, p.spec.ServiceAccountName)
		}
	}
	if node.AutomountServiceAccountToken == nil || *node.AutomountServiceAccountToken {
		r.Errorf("%s: the node pod calls no API: set automountServiceAccountToken: false", at)
	}

	clusterRoles := map[string]*rbacv1.ClusterRole{}
	for _, cr := range b.clusterRoles {
		clusterRoles[cr.Name] = cr
		checkRules(r, at+": ClusterRole "+cr.Name, cr.Rules)
	}
	roles := map[string]*rbacv1.Role{}
	for _, ro := range b.roles {
		roles[ro.Name] = ro
		checkRules(r, at+": Role "+ro.Name, ro.Rules)
	}
	// rulesOf collects the rules bound to a ServiceAccount, cluster-wide and
	// in csid's namespace.
	rulesOf := func(sa string) (cluster, local []rbacv1.PolicyRule) {
		isSubject := func(subjects []rbacv1.Subject) bool {
			return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
				return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == namespace
			})
		}
		for _, crb := range b.clusterRoleBindings {
			if cr := clusterRoles[crb.RoleRef.Name]; crb.RoleRef.Kind == "ClusterRole" && isSubject(crb.Subjects) {
				if cr == nil {
					r.Errorf("%s: ClusterRoleBinding %s refers to ClusterRole %q, which is not defined", at, crb.Name, crb.RoleRef.Name)
					continue
				}
				cluster = append(cluster, cr.Rules...)
			}
		}
		for _, rb := range b.roleBindings {
			if !isSubject(rb.Subjects) {
				continue
			}
			switch rb.RoleRef.Kind {
			case "Role":
				if ro := roles[rb.RoleRef.Name]; ro != nil {
					local = append(local, ro.Rules...)
				} else {
					r.Errorf("%s: RoleBinding %s refers to Role %q, which is not defined", at, rb.Name, rb.RoleRef.Name)
				}
			case "ClusterRole":
				if cr := clusterRoles[rb.RoleRef.Name]; cr != nil {
					local = append(local, cr.Rules...)
				}
			}
		}
		return cluster, local
	}

	if cluster, local := rulesOf(node.ServiceAccountName); len(cluster)+len(local) > 0 {
		r.Errorf("%s: the node pod's ServiceAccount %s is granted permissions it never uses", at, node.ServiceAccountName)
	}
	cluster, local := rulesOf(ctrl.ServiceAccountName)
	electing := false
	for repo, perms := range required {
		cs := byImage(ctrl, repo)
		if len(cs) != 1 {
			continue // reported by checkSocket
		}
		sf := parseFlags(cs[0].Args)
		if repo == snapshotterImage && groupSnapshotsOn(sf) {
			perms = append(slices.Clip(perms), groupSnapshotPerms...)
		}
		for _, p := range perms {
			if !allows(cluster, p) {
				r.Errorf("%s: %s (ServiceAccount %s) may not %s %s", at, cs[0].Name, ctrl.ServiceAccountName, p.verb, groupResource(p))
			}
		}
		le := sf.values["leader-election"]
		if len(le) == 1 && le[0] == "true" {
			electing = true
		}
	}
	leases := true
	for _, v := range leaseVerbs {
		leases = leases && allows(local, permission{"coordination.k8s.io", "leases", v})
	}
	switch {
	case electing && !leases:
		r.Errorf("%s: the sidecars elect a leader but %s may not get, create and update leases in %s", at, ctrl.ServiceAccountName, namespace)
	case !electing && len(local) > 0:
		r.Errorf("%s: no sidecar elects a leader: the namespaced Role (leases) is not needed", at)
	}
}

// checkRules: no wildcards, no secrets (csid takes none), no escalation.
func checkRules(r reporter, at string, rules []rbacv1.PolicyRule) {
	r.Helper()
	for _, rule := range rules {
		for _, list := range [][]string{rule.APIGroups, rule.Resources, rule.Verbs} {
			if slices.Contains(list, "*") {
				r.Errorf("%s: wildcard in %v", at, rule)
			}
		}
		for _, res := range rule.Resources {
			if res == "secrets" || res == "clusterroles" || res == "roles" || res == "clusterrolebindings" || res == "rolebindings" {
				r.Errorf("%s: grants access to %s, which none of csid's sidecars needs", at, res)
			}
		}
		for _, v := range rule.Verbs {
			if v == "escalate" || v == "bind" || v == "impersonate" {
				r.Errorf("%s: grants %s", at, v)
			}
		}
	}
}

func allows(rules []rbacv1.PolicyRule, p permission) bool {
	return slices.ContainsFunc(rules, func(rule rbacv1.PolicyRule) bool {
		return len(rule.ResourceNames) == 0 && slices.Contains(rule.APIGroups, p.group) &&
			slices.Contains(rule.Resources, p.resource) && slices.Contains(rule.Verbs, p.verb)
	})
}

func groupResource(p permission) string {
	if p.group == "" {
		return p.resource
	}
	return p.resource + "." + p.group
}

// --- what differs between the renderings --------------------------------------

// checkRealCloudController: the base's controller is unprivileged and owns
// a state directory of its own.
func checkRealCloudController(r reporter, b *bundle) {
	r.Helper()
	ctrl, node := onlyStatefulSet(r, b, controllerName), onlyDaemonSet(r, b, nodeName)
	if ctrl == nil || node == nil {
		return
	}
	at := b.name + ": StatefulSet " + ctrl.Name
	spec := &ctrl.Spec.Template.Spec
	csid := findContainer(spec, csidContainer)
	if csid == nil {
		return
	}
	u := runAs(spec, csid)
	if u == nil || *u == 0 || isPrivileged(csid) {
		r.Errorf("%s: the controller runs as an unprivileged, non-root user against a real cloud", at)
	}
	nonRoot := spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot
	if csid.SecurityContext != nil && csid.SecurityContext.RunAsNonRoot != nil {
		nonRoot = *csid.SecurityContext.RunAsNonRoot
	}
	if !nonRoot {
		r.Errorf("%s: set runAsNonRoot for csid", at)
	}
	// If the state is on a hostPath, it is not the node plugin's directory,
	// and an init container hands it to csid's user.
	sm := mountFor(csid, path.Clean(firstValue(parseFlags(csid.Args), "state-dir")))
	if sm == nil || u == nil {
		return
	}
	if v := volumeByName(spec, sm.Name); v != nil && v.HostPath != nil {
		if path.Clean(v.HostPath.Path) == "/var/lib/csid" {
			r.Errorf("%s: an unprivileged controller must not own the node plugin's /var/lib/csid", at)
		}
	}
	owner := fmt.Sprint(*u)
	if !slices.ContainsFunc(spec.InitContainers, func(c corev1.Container) bool {
		return slices.Contains(c.Command, owner) && mountFor(&c, path.Clean(sm.MountPath)) != nil
	}) {
		r.Errorf("%s: no init container hands the state directory to user %s", at, owner)
	}
}

// checkLocalSingleNode: the local backend's controller is privileged and on
// the node plugin's state directory.
func checkLocalSingleNode(r reporter, b *bundle) {
	r.Helper()
	ctrl, node := onlyStatefulSet(r, b, controllerName), onlyDaemonSet(r, b, nodeName)
	if ctrl == nil || node == nil {
		return
	}
	at := b.name + ": StatefulSet " + ctrl.Name
	cspec, nspec := &ctrl.Spec.Template.Spec, &node.Spec.Template.Spec
	ccsid, ncsid := findContainer(cspec, csidContainer), findContainer(nspec, csidContainer)
	if ccsid == nil || ncsid == nil {
		return
	}
	if u := runAs(cspec, ccsid); u == nil || *u != 0 || !isPrivileged(ccsid) {
		r.Errorf("%s: with the local backend the controller runs privileged as root (it releases loop devices)", at)
	}
	if len(cspec.InitContainers) != 0 {
		r.Errorf("%s: no init container may touch the shared state directory", at)
	}
	cf, nf := parseFlags(ccsid.Args), parseFlags(ncsid.Args)
	for what, f := range map[string]flags{"controller": cf, "node": nf} {
		if v := firstValue(f, "cloud"); v != "local" {
			r.Errorf("%s: %s csid --cloud=%q, want local", b.name, what, v)
		}
	}
	hostDir := func(spec *corev1.PodSpec, c *corev1.Container, f flags) string {
		if m := mountFor(c, path.Clean(firstValue(f, "state-dir"))); m != nil {
			if v := volumeByName(spec, m.Name); v != nil && v.HostPath != nil {
				return path.Clean(v.HostPath.Path)
			}
		}
		return ""
	}
	if c, n := hostDir(cspec, ccsid, cf), hostDir(nspec, ncsid, nf); c == "" || c != n {
		r.Errorf("%s: the controller's state directory (host %q) must be the node plugin's (host %q): the local backend's disks are there", at, c, n)
	}
	if m := mountFor(ccsid, "/dev/loop0"); m == nil || path.Clean(m.MountPath) != "/dev" {
		r.Errorf("%s: the local backend's controller needs the host's /dev", at)
	}
}

// checkStateOnClaim: the controller's state on a claim of another class.
func checkStateOnClaim(r reporter, b *bundle) {
	r.Helper()
	ctrl := onlyStatefulSet(r, b, controllerName)
	if ctrl == nil {
		return
	}
	at := b.name + ": StatefulSet " + ctrl.Name
	spec := &ctrl.Spec.Template.Spec
	csid := findContainer(spec, csidContainer)
	if csid == nil {
		return
	}
	m := mountFor(csid, path.Clean(firstValue(parseFlags(csid.Args), "state-dir")))
	if m == nil {
		return
	}
	if volumeByName(spec, m.Name) != nil {
		r.Errorf("%s: the state volume %q is still a pod volume; the claim template should provide it", at, m.Name)
	}
	i := slices.IndexFunc(ctrl.Spec.VolumeClaimTemplates, func(c corev1.PersistentVolumeClaim) bool { return c.Name == m.Name })
	if i < 0 {
		r.Errorf("%s: no volumeClaimTemplate %q for the state directory", at, m.Name)
		return
	}
	claim := ctrl.Spec.VolumeClaimTemplates[i]
	for _, sc := range b.storageClasses {
		if claim.Spec.StorageClassName != nil && *claim.Spec.StorageClassName == sc.Name {
			r.Errorf("%s: the controller's state must not be on csid's own class %q: csid would have to be running to provision it", at, sc.Name)
		}
	}
}

// checkExamples: the example claims use csid's class, the snapshots csid's
// VolumeSnapshotClass, every data source is an example object a copy may be
// made from, and the workloads are as pinned and bounded as the driver.
func checkExamples(r reporter, ex *bundle, base *bundle) {
	r.Helper()
	if len(ex.claims) == 0 {
		r.Errorf("%s: no example PersistentVolumeClaim", ex.name)
	}
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, c := range ex.claims {
		claims[c.Namespace+"/"+c.Name] = c
		if c.Spec.StorageClassName == nil || !slices.ContainsFunc(base.storageClasses, func(sc *storagev1.StorageClass) bool { return sc.Name == *c.Spec.StorageClassName }) {
			r.Errorf("%s: claim %s does not use csid's StorageClass", ex.name, c.Name)
		}
	}
	snapshots := checkExampleSnapshots(r, ex, base, claims)
	for _, c := range ex.claims {
		checkDataSource(r, ex.name, c, claims, snapshots)
	}
	specs := map[string]*corev1.PodSpec{}
	for _, p := range ex.pods {
		specs["Pod "+p.Name] = &p.Spec
	}
	for _, d := range ex.deployments {
		specs["Deployment "+d.Name] = &d.Spec.Template.Spec
	}
	if len(specs) == 0 {
		r.Errorf("%s: no example workload", ex.name)
	}
	for what, spec := range specs {
		checkPodSpec(r, ex.name+": "+what, spec, nil)
		uses := slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
			return v.PersistentVolumeClaim != nil && slices.ContainsFunc(ex.claims, func(c *corev1.PersistentVolumeClaim) bool {
				return c.Name == v.PersistentVolumeClaim.ClaimName
			})
		})
		if !uses {
			r.Errorf("%s: %s uses none of the example claims", ex.name, what)
		}
	}
}

// checkExampleSnapshots checks the example VolumeSnapshots (one at least:
// docs/deploy.md walks through one) and returns them by namespace/name with
// the claim each is taken of.
func checkExampleSnapshots(r reporter, ex, base *bundle, claims map[string]*corev1.PersistentVolumeClaim) map[string]*corev1.PersistentVolumeClaim {
	r.Helper()
	if len(ex.snapshots) == 0 {
		r.Errorf("%s: no example VolumeSnapshot", ex.name)
	}
	out := map[string]*corev1.PersistentVolumeClaim{}
	for _, vs := range ex.snapshots {
		at := ex.name + ": VolumeSnapshot " + vs.Name
		if name := vs.Spec.VolumeSnapshotClassName; name != nil && !slices.ContainsFunc(base.snapshotClasses, func(c *snapshotv1.VolumeSnapshotClass) bool { return c.Name == *name }) {
			r.Errorf("%s: class %q is not csid's VolumeSnapshotClass", at, *name)
		} else if name == nil && !slices.ContainsFunc(base.snapshotClasses, func(c *snapshotv1.VolumeSnapshotClass) bool {
			return c.Annotations["snapshot.storage.k8s.io/is-default-class"] == "true"
		}) {
			r.Errorf("%s: names no class, and csid's VolumeSnapshotClass is not the default", at)
		}
		src := vs.Spec.Source.PersistentVolumeClaimName
		if src == nil || vs.Spec.Source.VolumeSnapshotContentName != nil {
			r.Errorf("%s: want a snapshot of an example claim (source.persistentVolumeClaimName)", at)
			continue
		}
		c := claims[vs.Namespace+"/"+*src]
		if c == nil {
			r.Errorf("%s: source claim %s/%s is not an example claim", at, vs.Namespace, *src)
			continue
		}
		out[vs.Namespace+"/"+vs.Name] = c
	}
	return out
}

// checkDataSource: a claim made from a snapshot names an example
// VolumeSnapshot, a clone an example claim of its own class, and either asks
// for at least its source's size (a volume cannot be restored smaller).
func checkDataSource(r reporter, where string, c *corev1.PersistentVolumeClaim, claims, snapshots map[string]*corev1.PersistentVolumeClaim) {
	r.Helper()
	ds := c.Spec.DataSource
	if ds == nil {
		return
	}
	at := where + ": claim " + c.Name
	var src *corev1.PersistentVolumeClaim
	switch group := ptrValue(ds.APIGroup); {
	case group == snapshotGroup && ds.Kind == "VolumeSnapshot":
		if src = snapshots[c.Namespace+"/"+ds.Name]; src == nil {
			r.Errorf("%s: data source VolumeSnapshot %s/%s is not an example snapshot", at, c.Namespace, ds.Name)
			return
		}
	case group == "" && ds.Kind == "PersistentVolumeClaim":
		if src = claims[c.Namespace+"/"+ds.Name]; src == nil || src == c {
			r.Errorf("%s: data source claim %s/%s is not another example claim", at, c.Namespace, ds.Name)
			return
		}
		if ptrValue(src.Spec.StorageClassName) != ptrValue(c.Spec.StorageClassName) {
			r.Errorf("%s: a clone must be of its source's class %q, not %q", at, ptrValue(src.Spec.StorageClassName), ptrValue(c.Spec.StorageClassName))
		}
	default:
		r.Errorf("%s: data source %s %s: csid restores from a VolumeSnapshot or clones a claim", at, ds.Kind, ds.Name)
		return
	}
	want, got := src.Spec.Resources.Requests[corev1.ResourceStorage], c.Spec.Resources.Requests[corev1.ResourceStorage]
	if got.Cmp(want) < 0 {
		r.Errorf("%s: asks for %s, less than its source %s (%s)", at, got.String(), src.Name, want.String())
	}
}

func ptrValue(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// --- the tests --------------------------------------------------------------

// tree is a copy of this directory's manifests (or the directory itself).
type tree string

func (t tree) path(p string) string { return filepath.Join(string(t), filepath.FromSlash(p)) }

// checkTree renders and checks everything under t: the base, the overlay,
// the base with the claim component, and the examples.
func checkTree(r reporter, t tree, scratch string) {
	r.Helper()
	base, err := render(t.path("base"))
	if err != nil {
		r.Errorf("%v", err)
	} else {
		checkAll(r, base)
		checkRealCloudController(r, base)
	}

	local, err := render(t.path("overlays/local-single-node"))
	if err != nil {
		r.Errorf("%v", err)
	} else {
		checkAll(r, local)
		checkLocalSingleNode(r, local)
	}

	yandex, err := render(t.path("overlays/yandex"))
	if err != nil {
		r.Errorf("%v", err)
	} else {
		checkAll(r, yandex)
		checkRealCloudController(r, yandex)
		checkStateOnClaim(r, yandex)
		checkYandex(r, yandex)
	}

	// The component is meant to be added to an overlay of the base; build
	// the smallest such overlay.
	overlay := filepath.Join(scratch, "state-on-claim")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		r.Errorf("%v", err)
		return
	}
	rel := func(to string) string {
		p, err := filepath.Rel(overlay, to)
		if err != nil {
			r.Errorf("%v", err)
		}
		return filepath.ToSlash(p)
	}
	kust := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n",
		rel(t.path("base")), rel(t.path("components/controller-state-pvc")))
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		r.Errorf("%v", err)
		return
	}
	claim, err := render(overlay)
	if err != nil {
		r.Errorf("%v", err)
	} else {
		checkAll(r, claim)
		checkRealCloudController(r, claim)
		checkStateOnClaim(r, claim)
	}

	ex, err := readDocs(t.path("examples"))
	if err != nil {
		r.Errorf("%v", err)
	} else if base != nil {
		checkExamples(r, ex, base)
	}
}

func TestManifests(t *testing.T) {
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, tree(here), t.TempDir())
}

// TestSnapshotterRelease: csi-snapshotter, the snapshot CRDs and
// snapshot-controller that docs/deploy.md installs, and the snapshot API
// types this test decodes with are one external-snapshotter release: the
// version go.mod requires of snapshotClientModule.
func TestSnapshotterRelease(t *testing.T) {
	release := moduleVersion(t, snapshotClientModule)
	base, err := render("base")
	if err != nil {
		t.Fatal(err)
	}
	ctrl := onlyStatefulSet(t, base, controllerName)
	if ctrl == nil {
		return
	}
	cs := byImage(&ctrl.Spec.Template.Spec, snapshotterImage)
	if len(cs) != 1 {
		t.Fatalf("want one %s container, have %d", snapshotterImage, len(cs))
	}
	if tag := strings.TrimPrefix(cs[0].Image, snapshotterImage+":"); tag != release {
		t.Errorf("csi-snapshotter %s, but the snapshot API types are of %s %s: bump them together", tag, snapshotClientModule, release)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	checkDocPins(t, string(doc), release)
}

// checkDocPins: every external-snapshotter kustomization the page installs
// and every snapshot-controller image it names is of release, and the page
// installs both the CRDs and the controller.
func checkDocPins(r reporter, doc, release string) {
	r.Helper()
	refs := regexp.MustCompile(`github\.com/kubernetes-csi/external-snapshotter/([a-z/-]+)\?ref=([^'"\s]+)`).FindAllStringSubmatch(doc, -1)
	installed := map[string]bool{}
	for _, m := range refs {
		installed[m[1]] = true
		if m[2] != release {
			r.Errorf("docs/deploy.md installs external-snapshotter %s at %s, want %s", m[1], m[2], release)
		}
	}
	for _, dir := range []string{"client/config/crd", "deploy/kubernetes/snapshot-controller"} {
		if !installed[dir] {
			r.Errorf("docs/deploy.md does not install external-snapshotter's %s (?ref=%s)", dir, release)
		}
	}
	for _, m := range regexp.MustCompile(`sig-storage/(snapshot-controller|csi-snapshotter):(v[0-9]+(?:\.[0-9]+)*)`).FindAllStringSubmatch(doc, -1) {
		if m[2] != release {
			r.Errorf("docs/deploy.md names %s:%s, want %s", m[1], m[2], release)
		}
	}
}

// TestDocPinsCatchBreakage: checkDocPins notices an install step of another
// release, a missing one, and a controller image of another release.
func TestDocPinsCatchBreakage(t *testing.T) {
	const (
		crd  = "kubectl apply -k 'https://github.com/kubernetes-csi/external-snapshotter/client/config/crd?ref=v8.7.0'\n"
		ctrl = "kubectl apply -k 'https://github.com/kubernetes-csi/external-snapshotter/deploy/kubernetes/snapshot-controller?ref=v8.7.0'\n"
		img  = "kubectl set image deployment/snapshot-controller snapshot-controller=registry.k8s.io/sig-storage/snapshot-controller:v8.7.0\n"
	)
	var ok collector
	checkDocPins(&ok, crd+ctrl+img, "v8.7.0")
	if len(ok.errs) != 0 {
		t.Fatalf("a consistent page reported: %q", ok.errs)
	}
	for _, tc := range []struct{ name, doc, wantError string }{
		{"CRDs of another release", strings.Replace(crd, "v8.7.0", "v8.6.0", 1) + ctrl + img, "installs external-snapshotter client/config/crd at v8.6.0, want v8.7.0"},
		{"no controller", crd + img, "does not install external-snapshotter's deploy/kubernetes/snapshot-controller"},
		{"controller image of another release", crd + ctrl + strings.Replace(img, "v8.7.0", "v8.6.0", 1), "names snapshot-controller:v8.6.0, want v8.7.0"},
	} {
		var c collector
		checkDocPins(&c, tc.doc, "v8.7.0")
		if !slices.ContainsFunc(c.errs, func(e string) bool { return strings.Contains(e, tc.wantError) }) {
			t.Errorf("%s: not caught: want an error containing %q, got %q", tc.name, tc.wantError, c.errs)
		}
	}
}

// moduleVersion is the version go.mod requires of module.
func moduleVersion(t *testing.T, module string) string {
	t.Helper()
	const gomod = "../../go.mod"
	raw, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.ParseLax(gomod, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range f.Require {
		if req.Mod.Path == module {
			return req.Mod.Version
		}
	}
	t.Fatalf("%s does not require %s", gomod, module)
	return ""
}

// collector records what the checks report, for tests that break a
// manifest on purpose.
type collector struct{ errs []string }

func (c *collector) Helper() {}
func (c *collector) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// TestManifestsCatchBreakage breaks one thing at a time in a copy of the
// manifests and requires the checks to say so: a check that cannot fail
// checks nothing.
func TestManifestsCatchBreakage(t *testing.T) {
	type edit struct {
		file     string // relative to this directory
		old, new string // old must occur exactly once in file
	}
	for _, tc := range []struct {
		name      string
		edits     []edit
		wantError string // a substring of some reported error
	}{
		{
			name:  "registration path names another driver",
			edits: []edit{{"base/node.yaml", "--kubelet-registration-path=/var/lib/kubelet/plugins/csid.csi.dev/csi.sock", "--kubelet-registration-path=/var/lib/kubelet/plugins/csid/csi.sock"}},
			wantError: "--kubelet-registration-path=/var/lib/kubelet/plugins/csid/csi.sock, but csid's socket is " +
				"/var/lib/kubelet/plugins/csid.csi.dev/csi.sock",
		},
		{
			name:      "registrar and csid-address swapped",
			edits:     []edit{{"base/node.yaml", "- --csi-address=/csi/csi.sock\n            # The same socket", "- --csi-address=/var/lib/kubelet/plugins/csid.csi.dev/csi.sock\n            # The same socket"}},
			wantError: "node-driver-registrar --csi-address=/var/lib/kubelet/plugins/csid.csi.dev/csi.sock, but csid listens on /csi/csi.sock",
		},
		{
			name:      "resizer back to the in-use default",
			edits:     []edit{{"base/controller.yaml", "--handle-volume-inuse-error=false", "--handle-volume-inuse-error=true"}},
			wantError: "--handle-volume-inuse-error=true, want false",
		},
		{
			name:      "resizer without a retry cap",
			edits:     []edit{{"base/controller.yaml", "            - --retry-interval-max=30s\n", ""}},
			wantError: "flag --retry-interval-max missing",
		},
		{
			name:      "sidecar dials another socket",
			edits:     []edit{{"base/controller.yaml", "- --csi-address=/csi/csi.sock\n            - --leader-election\n            # csid only grows", "- --csi-address=/run/csi.sock\n            - --leader-election\n            # csid only grows"}},
			wantError: "csi-resizer --csi-address=/run/csi.sock, but csid listens on /csi/csi.sock",
		},
		{
			name:      "image not pinned",
			edits:     []edit{{"base/controller.yaml", "csi-attacher:v4.13.0", "csi-attacher:latest"}},
			wantError: `is not pinned (tag "latest")`,
		},
		{
			name:      "kubelet dir without bidirectional propagation",
			edits:     []edit{{"base/node.yaml", "mountPropagation: Bidirectional", "mountPropagation: HostToContainer"}},
			wantError: "csid's mount of /var/lib/kubelet must be Bidirectional",
		},
		{
			name:      "a misspelt field",
			edits:     []edit{{"base/node.yaml", "mountPropagation: Bidirectional", "mountPropogation: Bidirectional"}},
			wantError: `apps/v1 DaemonSet: unknown field "spec.template.spec.containers[0].volumeMounts[1].mountPropogation"`,
		},
		{
			name:      "a field in the wrong case",
			edits:     []edit{{"base/node.yaml", "mountPropagation: Bidirectional", "mountpropagation: Bidirectional"}},
			wantError: `apps/v1 DaemonSet: unknown field "spec.template.spec.containers[0].volumeMounts[1].mountpropagation"`,
		},
		{
			name:      "node plugin not privileged",
			edits:     []edit{{"base/node.yaml", "privileged: true", "privileged: false"}},
			wantError: "Bidirectional mount of /var/lib/kubelet in a container that is not privileged",
		},
		{
			name:      "a container without limits",
			edits:     []edit{{"base/node.yaml", "            limits:\n              # mkfs, resize2fs and xfs_growfs run in this container.\n              cpu: \"2\"\n              memory: 1Gi\n", ""}},
			wantError: "container csid: needs both a request and a limit for cpu",
		},
		{
			name:      "node plugin killed before its host tools finish",
			edits:     []edit{{"base/node.yaml", "terminationGracePeriodSeconds: 330", "terminationGracePeriodSeconds: 30"}},
			wantError: "kubelet would kill a resize2fs csid waits for",
		},
		{
			name:      "CSIDriver renamed",
			edits:     []edit{{"base/csidriver.yaml", "name: csid.csi.dev", "name: csid.example.com"}},
			wantError: `CSIDriver "csid.example.com", want csid's default driver name "csid.csi.dev"`,
		},
		{
			name:      "node plugin not confined to kubelet's directory",
			edits:     []edit{{"base/node.yaml", "            - --kubelet-root=/var/lib/kubelet\n", ""}},
			wantError: "flag --kubelet-root missing",
		},
		{
			name:      "liveness ports clash",
			edits:     []edit{{"base/node.yaml", "--health-port=9809", "--health-port=9808"}},
			wantError: "port 9808 used by both",
		},
		{
			name:      "leader election without leases",
			edits:     []edit{{"base/rbac-controller.yaml", `resources: ["leases"]`, `resources: ["configmaps"]`}},
			wantError: "may not get, create and update leases",
		},
		{
			name:      "overlay keeps the chown of the shared directory",
			edits:     []edit{{"overlays/local-single-node/controller-local.yaml", "          $patch: delete\n", ""}},
			wantError: "no init container may touch the shared state directory",
		},
		{
			name: "overlay sidecars cannot reach root's socket",
			edits: []edit{
				{"overlays/local-single-node/controller-local.yaml", "        $patch: replace\n        runAsUser: 0\n        runAsGroup: 0\n", "        $patch: replace\n        runAsUser: 65532\n        runAsGroup: 65532\n"},
				{"overlays/local-single-node/controller-local.yaml", "            privileged: true\n", "            privileged: true\n            runAsUser: 0\n"},
			},
			wantError: "runs as user 65532 but csid, which owns the socket, as 0",
		},
		{
			name:      "yandex key file outside the Secret's mount",
			edits:     []edit{{"overlays/yandex/controller-yandex.yaml", "--yandex-key-file=/etc/csid/yandex/key.json", "--yandex-key-file=/var/lib/csid/key.json"}},
			wantError: "--yandex-key-file=/var/lib/csid/key.json is not in the mount of a Secret",
		},
		{
			name:      "yandex key readable by every user",
			edits:     []edit{{"overlays/yandex/node-yandex.yaml", "defaultMode: 0400", "defaultMode: 0444"}},
			wantError: "the key file's mode 0444 lets any user of the node read it",
		},
		{
			name:      "yandex key unreadable by the unprivileged controller",
			edits:     []edit{{"overlays/yandex/controller-yandex.yaml", "defaultMode: 0440", "defaultMode: 0400"}},
			wantError: "csid (user 65532) cannot read the key file",
		},
		{
			name:      "yandex node named after the Kubernetes node",
			edits:     []edit{{"overlays/yandex/node-yandex.yaml", "            - --cloud=yandex\n", "            - --cloud=yandex\n            - --node-id=$(HOSTNAME)\n"}},
			wantError: "on Yandex the node id is the instance id",
		},
		{
			name:      "yandex folder from a key the ConfigMap lacks",
			edits:     []edit{{"overlays/yandex/controller-yandex.yaml", "                  key: folder-id\n", "                  key: folder\n"}},
			wantError: `has no value for "folder"`,
		},
		{
			name:      "yandex disk type misspelt",
			edits:     []edit{{"overlays/yandex/storageclass-yandex.yaml", "type: network-ssd", "type: ssd"}},
			wantError: `parameter type "ssd" is no Yandex disk type`,
		},
		{
			name:      "yandex overlay keeps the snapshot class",
			edits:     []edit{{"overlays/yandex/kustomization.yaml", "  - path: no-snapshots.yaml\n", ""}},
			wantError: "VolumeSnapshotClass csid, but csid's backend here takes no snapshots",
		},
		{
			name:      "yandex overlay keeps csi-snapshotter",
			edits:     []edit{{"overlays/yandex/controller-yandex.yaml", "        - name: csi-snapshotter\n          $patch: delete\n", ""}},
			wantError: "csi-snapshotter, but csid's backend here takes no snapshots",
		},
		{
			name:      "controller state on csid's own class",
			edits:     []edit{{"components/controller-state-pvc/statefulset-pvc.yaml", "        accessModes: [\"ReadWriteOnce\"]\n", "        accessModes: [\"ReadWriteOnce\"]\n        storageClassName: csid\n"}},
			wantError: "must not be on csid's own class",
		},
		{
			name:      "snapshot class of another driver",
			edits:     []edit{{"base/volumesnapshotclass.yaml", "driver: csid.csi.dev", "driver: csid.example.com"}},
			wantError: `VolumeSnapshotClass csid driver "csid.example.com", want the CSIDriver's name "csid.csi.dev"`,
		},
		{
			name:      "snapshot class that retains",
			edits:     []edit{{"base/volumesnapshotclass.yaml", "deletionPolicy: Delete", "deletionPolicy: Retain"}},
			wantError: `VolumeSnapshotClass csid deletionPolicy "Retain", want Delete`,
		},
		{
			name:      "snapshot class missing",
			edits:     []edit{{"base/kustomization.yaml", "  - volumesnapshotclass.yaml\n", ""}},
			wantError: "want one VolumeSnapshotClass beside the StorageClass, have 0",
		},
		{
			name:      "a misspelt snapshot class field",
			edits:     []edit{{"base/volumesnapshotclass.yaml", "deletionPolicy: Delete", "deletionpolicy: Delete"}},
			wantError: `snapshot.storage.k8s.io/v1 VolumeSnapshotClass: unknown field "deletionpolicy"`,
		},
		{
			name:      "snapshotter dials another socket",
			edits:     []edit{{"base/controller.yaml", "- --csi-address=/csi/csi.sock\n            - --leader-election\n            # csid has no group", "- --csi-address=/run/csi.sock\n            - --leader-election\n            # csid has no group"}},
			wantError: "csi-snapshotter --csi-address=/run/csi.sock, but csid listens on /csi/csi.sock",
		},
		{
			name:      "snapshotter not pinned",
			edits:     []edit{{"base/controller.yaml", "csi-snapshotter:v8.7.0", "csi-snapshotter:latest"}},
			wantError: `image "registry.k8s.io/sig-storage/csi-snapshotter:latest" is not pinned`,
		},
		{
			name:      "snapshotter missing",
			edits:     []edit{{"base/controller.yaml", "image: registry.k8s.io/sig-storage/csi-snapshotter:v8.7.0", "image: registry.k8s.io/sig-storage/csi-attacher:v4.13.0"}},
			wantError: "the controller runs no csi-snapshotter",
		},
		{
			name:      "snapshotter cannot update snapshot status",
			edits:     []edit{{"base/rbac-controller.yaml", `resources: ["volumesnapshotcontents/status"]`, `resources: ["volumesnapshots/status"]`}},
			wantError: "csi-snapshotter (ServiceAccount csid-controller) may not patch volumesnapshotcontents/status.snapshot.storage.k8s.io",
		},
		{
			name:      "snapshotter with group snapshots and no rules for them",
			edits:     []edit{{"base/controller.yaml", "            - --feature-gates=CSIVolumeGroupSnapshot=false\n", ""}},
			wantError: "csi-snapshotter (ServiceAccount csid-controller) may not watch volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io",
		},
		{
			name:      "provisioner cannot read snapshots",
			edits:     []edit{{"base/rbac-controller.yaml", `resources: ["volumesnapshots"]`, `resources: ["volumesnapshotlocations"]`}},
			wantError: "csi-provisioner (ServiceAccount csid-controller) may not get volumesnapshots.snapshot.storage.k8s.io",
		},
		{
			name:      "snapshotter elects a leader without a probe",
			edits:     []edit{{"base/controller.yaml", "              path: /healthz/leader-election\n              port: snap-http\n", "              path: /healthz\n              port: snap-http\n"}},
			wantError: "csi-snapshotter elects a leader but has no liveness probe on /healthz/leader-election",
		},
		{
			name:      "restore from a snapshot that is not there",
			edits:     []edit{{"examples/copies.yaml", "    kind: VolumeSnapshot\n    name: csid-demo-snap\n", "    kind: VolumeSnapshot\n    name: csid-demo-snapshot\n"}},
			wantError: "data source VolumeSnapshot default/csid-demo-snapshot is not an example snapshot",
		},
		{
			name:      "restore smaller than its snapshot",
			edits:     []edit{{"examples/copies.yaml", "      storage: 1Gi\n  dataSource:\n    apiGroup", "      storage: 512Mi\n  dataSource:\n    apiGroup"}},
			wantError: "claim csid-demo-restore: asks for 512Mi, less than its source csid-demo (1Gi)",
		},
		{
			name:      "clone of another class",
			edits:     []edit{{"examples/copies.yaml", "  storageClassName: csid\n  accessModes: [\"ReadWriteOnce\"]\n  resources:\n    requests:\n      storage: 1Gi\n  dataSource:\n    kind: PersistentVolumeClaim", "  storageClassName: other\n  accessModes: [\"ReadWriteOnce\"]\n  resources:\n    requests:\n      storage: 1Gi\n  dataSource:\n    kind: PersistentVolumeClaim"}},
			wantError: `claim csid-demo-clone: a clone must be of its source's class "csid", not "other"`,
		},
		{
			name:      "snapshot of a claim that is not there",
			edits:     []edit{{"examples/snapshot.yaml", "persistentVolumeClaimName: csid-demo", "persistentVolumeClaimName: csid-gone"}},
			wantError: "source claim default/csid-gone is not an example claim",
		},
		{
			name:      "snapshot of another class",
			edits:     []edit{{"examples/snapshot.yaml", "volumeSnapshotClassName: csid", "volumeSnapshotClassName: other"}},
			wantError: `VolumeSnapshot csid-demo-snap: class "other" is not csid's VolumeSnapshotClass`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			copyManifests(t, ".", dir)
			for _, e := range tc.edits {
				f := filepath.Join(dir, filepath.FromSlash(e.file))
				raw, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if n := strings.Count(string(raw), e.old); n != 1 {
					t.Fatalf("%s: %q occurs %d times, want once: update this test with the manifest", e.file, e.old, n)
				}
				if err := os.WriteFile(f, []byte(strings.Replace(string(raw), e.old, e.new, 1)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var c collector
			checkTree(&c, tree(dir), t.TempDir())
			if !slices.ContainsFunc(c.errs, func(e string) bool { return strings.Contains(e, tc.wantError) }) {
				t.Errorf("broken manifest not caught: want an error containing %q, got %d:\n%s", tc.wantError, len(c.errs), strings.Join(c.errs, "\n"))
			}
		})
	}
}

// copyManifests copies the YAML files under src (this directory) to dst.
func copyManifests(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || filepath.Ext(p) != ".yaml" {
			return nil
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, p)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, raw, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
