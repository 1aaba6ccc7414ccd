package kubernetes

import (
	"path"
	"slices"
	"strings"

	"github.com/csid-dev/csid/internal/cloud/yandex"
	corev1 "k8s.io/api/core/v1"
)

// checkYandex: the overlay for Yandex Compute Cloud. Both csid containers
// run --cloud=yandex with the folder and the zones (literal, or from a key
// of a ConfigMap of the bundle) and the service account's key mounted
// read-only from a Secret, readable by csid and nobody else; the node
// takes its id from the metadata service; the StorageClass names
// a Yandex disk type.
func checkYandex(r reporter, b *bundle) {
	r.Helper()
	ctrl, node := onlyStatefulSet(r, b, controllerName), onlyDaemonSet(r, b, nodeName)
	if ctrl == nil || node == nil {
		return
	}
	for _, p := range []struct {
		at   string
		spec *corev1.PodSpec
	}{{b.name + ": StatefulSet " + ctrl.Name, &ctrl.Spec.Template.Spec}, {b.name + ": DaemonSet " + node.Name, &node.Spec.Template.Spec}} {
		c := findContainer(p.spec, csidContainer)
		if c == nil {
			continue
		}
		at := p.at + ": csid"
		f := parseFlags(c.Args)
		if v := firstValue(f, "cloud"); v != "yandex" {
			r.Errorf("%s: --cloud=%q, want yandex", at, v)
		}
		for _, name := range []string{"yandex-folder-id", "yandex-zones"} {
			if v, ok := f.get(r, at, name); ok {
				checkYandexValue(r, at, b, c, name, v)
			}
		}
		if v, ok := f.get(r, at, "yandex-key-file"); ok {
			checkKeyFile(r, at, p.spec, c, v)
		}
		for _, name := range []string{"yandex-insecure", "zone"} {
			if v := f.values[name]; len(v) > 0 {
				r.Errorf("%s: --%s=%s has no place in a deployment on Yandex", at, name, v[0])
			}
		}
	}
	for _, sc := range b.storageClasses {
		if t, ok := sc.Parameters["type"]; ok && !slices.Contains(yandex.DiskTypes, t) {
			r.Errorf("%s: StorageClass %s parameter type %q is no Yandex disk type (%s)", b.name, sc.Name, t, strings.Join(yandex.DiskTypes, ", "))
		}
	}
}

// checkYandexValue: flag name's value v is literal, or $(VAR) of an
// environment variable of c taken from a key of a ConfigMap of the bundle
// that holds a value.
func checkYandexValue(r reporter, at string, b *bundle, c *corev1.Container, name, v string) {
	r.Helper()
	if v == "" {
		r.Errorf("%s: --%s is empty", at, name)
		return
	}
	ref, ok := strings.CutPrefix(v, "$(")
	if !ok {
		return
	}
	ref = strings.TrimSuffix(ref, ")")
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == ref })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.ConfigMapKeyRef == nil {
		r.Errorf("%s: --%s=%s: %s is not set from a ConfigMap", at, name, v, ref)
		return
	}
	key := c.Env[i].ValueFrom.ConfigMapKeyRef
	j := slices.IndexFunc(b.configMaps, func(m *corev1.ConfigMap) bool { return m.Name == key.Name })
	if j < 0 {
		r.Errorf("%s: --%s=%s: ConfigMap %q is not in the bundle", at, name, v, key.Name)
		return
	}
	if b.configMaps[j].Data[key.Key] == "" {
		r.Errorf("%s: --%s=%s: ConfigMap %s has no value for %q", at, name, v, key.Name, key.Key)
	}
}

// checkKeyFile: the key file is a file of a Secret volume mounted
// read-only, readable by csid (its user, or its group through fsGroup)
// and by nobody else.
func checkKeyFile(r reporter, at string, spec *corev1.PodSpec, c *corev1.Container, file string) {
	r.Helper()
	m := mountFor(c, path.Clean(file))
	var v *corev1.Volume
	if m != nil {
		v = volumeByName(spec, m.Name)
	}
	if v == nil || v.Secret == nil {
		r.Errorf("%s: --yandex-key-file=%s is not in the mount of a Secret", at, file)
		return
	}
	if !m.ReadOnly {
		r.Errorf("%s: the Secret %s with the key is mounted writable", at, v.Secret.SecretName)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(path.Clean(file), path.Clean(m.MountPath)), "/")
	mode := v.Secret.DefaultMode
	if len(v.Secret.Items) > 0 {
		i := slices.IndexFunc(v.Secret.Items, func(it corev1.KeyToPath) bool { return path.Clean(it.Path) == rel })
		if i < 0 {
			r.Errorf("%s: --yandex-key-file=%s: the Secret %s's volume has no item at %s", at, file, v.Secret.SecretName, rel)
			return
		}
		if it := v.Secret.Items[i]; it.Mode != nil {
			mode = it.Mode
		}
	}
	perm := int32(0o644) // the API's default
	if mode != nil {
		perm = *mode
	}
	if perm&0o007 != 0 {
		r.Errorf("%s: the key file's mode %#o lets any user of the node read it", at, perm)
	}
	u := runAs(spec, c)
	fsGroup := spec.SecurityContext != nil && spec.SecurityContext.FSGroup != nil
	switch {
	case u != nil && *u == 0:
	case perm&0o040 != 0 && fsGroup:
	default:
		r.Errorf("%s: csid (user %v) cannot read the key file (mode %#o, fsGroup set: %v)", at, ptrInt(u), perm, fsGroup)
	}
}

func ptrInt(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}
