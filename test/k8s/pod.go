package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pod is one pod of a StatefulSet as the kubelet would start its (single)
// container: the environment it declares, resolved, its arguments expanded,
// and its volumes as local directories.
type Pod struct {
	Name      string // <statefulset>-<ordinal>
	Namespace string
	Ordinal   int
	Container corev1.Container
	// Env is the container's environment in the kubelet's order: the
	// Service link variables (unless enableServiceLinks is false), then
	// the container's env, each value resolved (downward API) and
	// expanded ($(VAR)).
	Env []EnvVar
	// Command is the container's command and args, expanded. With no
	// command the image's entrypoint runs: Command then holds only the
	// args, and EntrypointFromImage is true.
	Command             []string
	EntrypointFromImage bool
	// Mounts are the container's volume mounts, each with the local
	// directory that stands for the volume.
	Mounts []Mount
}

// EnvVar is one resolved environment variable.
type EnvVar struct{ Name, Value string }

// Mount is a volume mount and the local directory holding the volume.
type Mount struct {
	Path     string // the container's mountPath
	Volume   string // the volume's name
	Local    string // the local directory
	Claim    string // the PersistentVolumeClaim's name (<template>-<pod>), for a claim template
	ReadOnly bool
}

// ServiceClusterIP is the address the Service link variables are made
// with for a Service that has a cluster IP (one that is not headless): the
// rendered manifests have none yet.
const ServiceClusterIP = "10.96.0.10"

// MakePod resolves pod ordinal of sts, with the volumes laid out under dir:
// each volume claim in dir/claims/<template>-<pod> (so it outlives a
// restart of the pod, as a PVC does), each ConfigMap volume written from m's
// ConfigMaps into dir/<pod>/<volume>, an optional Secret absent from m as an
// empty directory. Creating the directories again is harmless: a restart of
// the pod calls MakePod again on the same dir.
func MakePod(m *Manifests, sts *appsv1.StatefulSet, ordinal int, namespace, dir string) (*Pod, error) {
	spec := sts.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		return nil, fmt.Errorf("StatefulSet %s has %d containers, want 1", sts.Name, len(spec.Containers))
	}
	if len(spec.InitContainers) != 0 {
		return nil, fmt.Errorf("StatefulSet %s has init containers, which this rehearsal does not run", sts.Name)
	}
	c := spec.Containers[0]
	p := &Pod{Name: fmt.Sprintf("%s-%d", sts.Name, ordinal), Namespace: namespace, Ordinal: ordinal, Container: c}

	// The kubelet's order: Service links first (when enabled), then
	// envFrom, then env; a later variable replaces an earlier one, and
	// $(VAR) expands to a variable defined before.
	vars := map[string]string{}
	set := func(name, value string) {
		if _, ok := vars[name]; ok {
			for i := range p.Env {
				if p.Env[i].Name == name {
					p.Env = append(p.Env[:i], p.Env[i+1:]...)
					break
				}
			}
		}
		vars[name] = value
		p.Env = append(p.Env, EnvVar{name, value})
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		for _, kv := range ServiceLinkEnv(m.Services) {
			set(kv.Name, kv.Value)
		}
	}
	if len(c.EnvFrom) != 0 {
		return nil, fmt.Errorf("container %s uses envFrom, which this rehearsal does not resolve", c.Name)
	}
	lookup := func(name string) (string, bool) { v, ok := vars[name]; return v, ok }
	for _, e := range c.Env {
		v, err := resolveEnv(e, p, c)
		if err != nil {
			return nil, err
		}
		set(e.Name, v)
	}
	p.EntrypointFromImage = len(c.Command) == 0
	for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
		p.Command = append(p.Command, Expand(a, lookup))
	}

	claims := map[string]bool{}
	for _, t := range sts.Spec.VolumeClaimTemplates {
		claims[t.Name] = true
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		if vm.SubPath != "" || vm.SubPathExpr != "" {
			return nil, fmt.Errorf("volume mount %s uses a subPath, which this rehearsal does not lay out", vm.Name)
		}
		mt := Mount{Path: vm.MountPath, Volume: vm.Name, ReadOnly: vm.ReadOnly}
		if claims[vm.Name] {
			mt.Claim = vm.Name + "-" + p.Name
			mt.Local = filepath.Join(dir, "claims", mt.Claim)
			if err := os.MkdirAll(mt.Local, 0o755); err != nil {
				return nil, err
			}
			p.Mounts = append(p.Mounts, mt)
			continue
		}
		v, ok := volumes[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %s: no such volume or claim template", vm.Name)
		}
		mt.Local = filepath.Join(dir, p.Name, vm.Name)
		if err := os.RemoveAll(mt.Local); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(mt.Local, 0o755); err != nil {
			return nil, err
		}
		switch {
		case v.ConfigMap != nil:
			if err := writeConfigMap(m, v.ConfigMap, mt.Local); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
		case v.Secret != nil:
			// The rendered manifests hold no Secret (it is made by hand,
			// see statefulset.yaml): the kubelet starts the pod with an
			// empty volume only when the reference is optional.
			if v.Secret.Optional == nil || !*v.Secret.Optional {
				return nil, fmt.Errorf("volume %s: Secret %s is not in the manifests and not optional: the pod would not start", v.Name, v.Secret.SecretName)
			}
		case v.EmptyDir != nil:
		default:
			return nil, fmt.Errorf("volume %s: only configMap, secret and emptyDir volumes are laid out", v.Name)
		}
		p.Mounts = append(p.Mounts, mt)
	}
	return p, nil
}

// resolveEnv returns the value of one env entry of pod p's container c.
func resolveEnv(e corev1.EnvVar, p *Pod, c corev1.Container) (string, error) {
	if e.ValueFrom == nil {
		// Expanded against the variables defined before it.
		return expandDefined(e.Value, p), nil
	}
	switch f := e.ValueFrom; {
	case f.FieldRef != nil:
		switch f.FieldRef.FieldPath {
		case "metadata.name":
			return p.Name, nil
		case "metadata.namespace":
			return p.Namespace, nil
		case "spec.nodeName":
			return "rehearsal-node", nil
		case "status.podIP", "status.hostIP":
			return "127.0.0.1", nil
		}
		return "", fmt.Errorf("env %s: fieldRef %s is not resolved by this rehearsal", e.Name, f.FieldRef.FieldPath)
	case f.ResourceFieldRef != nil:
		r := f.ResourceFieldRef
		var q resource.Quantity
		var ok bool
		switch {
		case strings.HasPrefix(r.Resource, "limits."):
			q, ok = c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(r.Resource, "limits."))]
		case strings.HasPrefix(r.Resource, "requests."):
			q, ok = c.Resources.Requests[corev1.ResourceName(strings.TrimPrefix(r.Resource, "requests."))]
		}
		if !ok {
			return "", fmt.Errorf("env %s: resourceFieldRef %s: the container sets no such resource", e.Name, r.Resource)
		}
		div := r.Divisor
		if div.IsZero() {
			div = resource.MustParse("1")
		}
		// The kubelet rounds up: ceil(quantity / divisor).
		n := (q.MilliValue() + div.MilliValue() - 1) / div.MilliValue()
		return strconv.FormatInt(n, 10), nil
	}
	return "", fmt.Errorf("env %s: only fieldRef and resourceFieldRef are resolved by this rehearsal", e.Name)
}

// expandDefined expands $(VAR) in s against the variables p has so far.
func expandDefined(s string, p *Pod) string {
	return Expand(s, func(name string) (string, bool) {
		for i := len(p.Env) - 1; i >= 0; i-- {
			if p.Env[i].Name == name {
				return p.Env[i].Value, true
			}
		}
		return "", false
	})
}

// Expand does the kubelet's expansion of env values, command and args:
// $(VAR) becomes the value of VAR when lookup knows it and stays as it is
// otherwise, $$ becomes $, any other $ stays.
func Expand(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// ServiceLinkEnv returns the Docker-link variables the kubelet adds for the
// namespace's Services that have a cluster IP (headless ones get none):
// NAME_SERVICE_HOST, NAME_SERVICE_PORT, NAME_SERVICE_PORT_<PORT NAME>,
// NAME_PORT, NAME_PORT_<P>_<PROTO>[_PROTO|_PORT|_ADDR], NAME the Service's
// name in upper case with '-' as '_'.
func ServiceLinkEnv(services []*corev1.Service) []EnvVar {
	var out []EnvVar
	for _, s := range services {
		if s.Spec.ClusterIP == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
			continue
		}
		ip := s.Spec.ClusterIP
		if ip == "" {
			ip = ServiceClusterIP
		}
		n := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		first := s.Spec.Ports[0]
		out = append(out,
			EnvVar{n + "_SERVICE_HOST", ip},
			EnvVar{n + "_SERVICE_PORT", strconv.Itoa(int(first.Port))})
		for _, sp := range s.Spec.Ports {
			if sp.Name != "" {
				out = append(out, EnvVar{n + "_SERVICE_PORT_" + strings.ToUpper(strings.ReplaceAll(sp.Name, "-", "_")), strconv.Itoa(int(sp.Port))})
			}
		}
		proto := func(sp corev1.ServicePort) string {
			if sp.Protocol == "" {
				return "tcp"
			}
			return strings.ToLower(string(sp.Protocol))
		}
		out = append(out, EnvVar{n + "_PORT", fmt.Sprintf("%s://%s:%d", proto(first), ip, first.Port)})
		for _, sp := range s.Spec.Ports {
			pre := fmt.Sprintf("%s_PORT_%d_%s", n, sp.Port, strings.ToUpper(proto(sp)))
			out = append(out,
				EnvVar{pre, fmt.Sprintf("%s://%s:%d", proto(sp), ip, sp.Port)},
				EnvVar{pre + "_PROTO", proto(sp)},
				EnvVar{pre + "_PORT", strconv.Itoa(int(sp.Port))},
				EnvVar{pre + "_ADDR", ip})
		}
	}
	return out
}

// writeConfigMap writes the keys of a ConfigMap volume into dir.
func writeConfigMap(m *Manifests, src *corev1.ConfigMapVolumeSource, dir string) error {
	cm, err := m.ConfigMap(src.Name)
	if err != nil {
		if src.Optional != nil && *src.Optional {
			return nil
		}
		return err
	}
	mode := os.FileMode(0o644)
	if src.DefaultMode != nil {
		mode = os.FileMode(*src.DefaultMode)
	}
	type file struct {
		key, path string
		mode      os.FileMode
	}
	var files []file
	if len(src.Items) == 0 {
		for k := range cm.Data {
			files = append(files, file{k, k, mode})
		}
		sort.Slice(files, func(i, j int) bool { return files[i].key < files[j].key })
	}
	for _, it := range src.Items {
		f := file{it.Key, it.Path, mode}
		if it.Mode != nil {
			f.mode = os.FileMode(*it.Mode)
		}
		files = append(files, f)
	}
	for _, f := range files {
		data, ok := cm.Data[f.key]
		if !ok {
			return fmt.Errorf("ConfigMap %s has no key %q", cm.Name, f.key)
		}
		path := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(data), f.mode); err != nil {
			return err
		}
	}
	return nil
}

// Getenv returns the value of the pod's variable name.
func (p *Pod) Getenv(name string) (string, bool) {
	for _, e := range p.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// Setenv replaces the value of name, or adds it at the end.
func (p *Pod) Setenv(name, value string) {
	for i := range p.Env {
		if p.Env[i].Name == name {
			p.Env[i].Value = value
			return
		}
	}
	p.Env = append(p.Env, EnvVar{name, value})
}

// Environ returns the environment as NAME=VALUE strings.
func (p *Pod) Environ() []string {
	out := make([]string, len(p.Env))
	for i, e := range p.Env {
		out[i] = e.Name + "=" + e.Value
	}
	return out
}

// Mount returns the mount of volume (or claim template) name.
func (p *Pod) Mount(name string) (Mount, bool) {
	for _, mt := range p.Mounts {
		if mt.Volume == name {
			return mt, true
		}
	}
	return Mount{}, false
}

// LocalPath maps a path inside the container to the local directory of the
// mount it lies in (the mount with the longest matching mountPath), and
// reports whether it lies in one.
func (p *Pod) LocalPath(path string) (string, bool) {
	best := -1
	for i, mt := range p.Mounts {
		if path == mt.Path || strings.HasPrefix(path, strings.TrimSuffix(mt.Path, "/")+"/") {
			if best < 0 || len(mt.Path) > len(p.Mounts[best].Path) {
				best = i
			}
		}
	}
	if best < 0 {
		return path, false
	}
	mt := p.Mounts[best]
	return filepath.Join(mt.Local, strings.TrimPrefix(path, mt.Path)), true
}

// LocalizePaths replaces, in every env value and argument, each path that
// lies in a mount by the local path (a value that is a path or a
// comma-separated list of them; "--flag=path" arguments too). It returns
// what it replaced, old → new.
func (p *Pod) LocalizePaths() map[string]string {
	done := map[string]string{}
	local := func(v string) string {
		parts := strings.Split(v, ",")
		for i, part := range parts {
			flag, path, isFlag := strings.Cut(part, "=")
			if !isFlag {
				flag, path = "", part
			}
			if !strings.HasPrefix(path, "/") {
				continue
			}
			if l, ok := p.LocalPath(path); ok {
				done[path] = l
				if isFlag {
					parts[i] = flag + "=" + l
				} else {
					parts[i] = l
				}
			}
		}
		return strings.Join(parts, ",")
	}
	for i := range p.Env {
		p.Env[i].Value = local(p.Env[i].Value)
	}
	for i := range p.Command {
		p.Command[i] = local(p.Command[i])
	}
	return done
}

// ContainerPort resolves a probe's or Service's port (a number or the name
// of one of the container's ports) to the container port number.
func ContainerPort(c corev1.Container, port intstr.IntOrString) (int32, error) {
	if port.Type == intstr.Int {
		return port.IntVal, nil
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return cp.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, port.StrVal)
}
