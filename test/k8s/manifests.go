// Package k8s checks salesagg's Kubernetes manifests (deploy/k8s): it renders
// the kustomize overlays, decodes every object strictly into the k8s.io/api
// types, and turns the StatefulSet's pod template into local processes the
// way the kubelet would run them (the env it declares with the downward API
// resolved, its volumes as directories, its probes). It is a module of its
// own, so that the service's module carries no Kubernetes dependencies.
package k8s

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Overlays are the overlays under deploy/k8s/overlays and the replicas
// each declares.
var Overlays = map[string]int32{"dev": 1, "prod": 3}

// RepoRoot returns the main module's root, two levels above this package's
// directory (where go test runs).
func RepoRoot() (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "deploy", "k8s", "base", "kustomization.yaml")); err != nil {
		return "", fmt.Errorf("not the repository root (no deploy/k8s/base/kustomization.yaml): %w", err)
	}
	return root, nil
}

// OverlayDir returns deploy/k8s/overlays/<name> under root.
func OverlayDir(root, name string) string {
	return filepath.Join(root, "deploy", "k8s", "overlays", name)
}

// Render builds the kustomization in dir with the kustomize Go API
// (sigs.k8s.io/kustomize/api/krusty, default options: no plugins, loads
// restricted to the kustomization's root), as `kubectl kustomize dir` does.
func Render(dir string) ([]byte, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	return m.AsYaml()
}

// RenderKubectl runs `kubectl kustomize dir`.
func RenderKubectl(kubectl, dir string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %v: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Documents splits a YAML stream into its documents, each converted to JSON
// (duplicate keys are an error). Empty documents are dropped.
func Documents(stream []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 || string(bytes.TrimSpace(doc)) == "---" {
			continue
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", len(docs), err)
		}
		if string(j) == "null" {
			continue
		}
		docs = append(docs, j)
	}
}

// Manifests are the objects of one rendered overlay, decoded strictly.
type Manifests struct {
	StatefulSets []*appsv1.StatefulSet
	Services     []*corev1.Service
	ConfigMaps   []*corev1.ConfigMap
	PDBs         []*policyv1.PodDisruptionBudget
	Policies     []*networkingv1.NetworkPolicy
	Certificates []*Certificate
	// Objects names every object as kind/name, in the rendered order.
	Objects []string
}

// Decode decodes every document of a rendered stream into its k8s.io/api
// type. A field the type does not have, a kind this package does not expect,
// trailing data or a document without kind or name is an error.
func Decode(stream []byte) (*Manifests, error) {
	docs, err := Documents(stream)
	if err != nil {
		return nil, err
	}
	m := &Manifests{}
	for i, doc := range docs {
		var tm metav1.TypeMeta
		if err := json.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var obj interface {
			GetName() string
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 StatefulSet":
			obj = appendNew(&m.StatefulSets)
		case "v1 Service":
			obj = appendNew(&m.Services)
		case "v1 ConfigMap":
			obj = appendNew(&m.ConfigMaps)
		case "policy/v1 PodDisruptionBudget":
			obj = appendNew(&m.PDBs)
		case "networking.k8s.io/v1 NetworkPolicy":
			obj = appendNew(&m.Policies)
		case "cert-manager.io/v1 Certificate":
			obj = appendNew(&m.Certificates)
		default:
			return nil, fmt.Errorf("document %d: unexpected apiVersion %q kind %q", i, tm.APIVersion, tm.Kind)
		}
		if err := StrictJSON(doc, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		if obj.GetName() == "" {
			return nil, fmt.Errorf("document %d (%s): no metadata.name", i, tm.Kind)
		}
		m.Objects = append(m.Objects, tm.Kind+"/"+obj.GetName())
	}
	return m, nil
}

// Certificate is the part of cert-manager's Certificate (cert-manager.io/v1)
// the TLS component uses; decoded strictly like the rest, so a field outside
// it is an error here (extend the type when the component grows).
type Certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string `json:"secretName"`
		Duration    string `json:"duration"`
		RenewBefore string `json:"renewBefore"`
		PrivateKey  struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		Usages    []string `json:"usages"`
		DNSNames  []string `json:"dnsNames"`
		IssuerRef struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// RenderWith renders a kustomization made on the fly in a temporary dir:
// the overlay's resources with the components added (as an operator's own
// overlay would).
func RenderWith(root, overlay string, components ...string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "salesagg-kustomize-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// kustomize takes relative paths only.
	rel := func(p string) (string, error) {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		return filepath.Rel(dir, abs)
	}
	var b strings.Builder
	o, err := rel(OverlayDir(root, overlay))
	if err != nil {
		return nil, err
	}
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + o + "\ncomponents:\n")
	for _, c := range components {
		cp, err := rel(filepath.Join(root, "deploy", "k8s", "components", c))
		if err != nil {
			return nil, err
		}
		b.WriteString("  - " + cp + "\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return Render(dir)
}

// StrictJSON decodes one JSON value into v, failing on a field v's type does
// not have and on anything after the value.
func StrictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the object")
	}
	return nil
}

// SameObjects compares two rendered streams as sets of objects (kustomize's
// Go API keeps the resources' order, kubectl sorts them): it returns the
// differences, none when both hold the same objects with the same content.
func SameObjects(a, b []byte) ([]string, error) {
	index := func(stream []byte) (map[string]any, error) {
		docs, err := Documents(stream)
		if err != nil {
			return nil, err
		}
		out := map[string]any{}
		for _, d := range docs {
			var obj map[string]any
			if err := json.Unmarshal(d, &obj); err != nil {
				return nil, err
			}
			md, _ := obj["metadata"].(map[string]any)
			key := fmt.Sprintf("%v %v/%v/%v", obj["apiVersion"], obj["kind"], md["namespace"], md["name"])
			if _, dup := out[key]; dup {
				return nil, fmt.Errorf("object %s twice", key)
			}
			out[key] = obj
		}
		return out, nil
	}
	ia, err := index(a)
	if err != nil {
		return nil, err
	}
	ib, err := index(b)
	if err != nil {
		return nil, err
	}
	var diffs []string
	for k, va := range ia {
		vb, ok := ib[k]
		switch {
		case !ok:
			diffs = append(diffs, k+": only in the first")
		case !reflect.DeepEqual(va, vb):
			ja, _ := json.Marshal(va)
			jb, _ := json.Marshal(vb)
			diffs = append(diffs, fmt.Sprintf("%s differs:\n  %s\n  %s", k, ja, jb))
		}
	}
	for k := range ib {
		if _, ok := ia[k]; !ok {
			diffs = append(diffs, k+": only in the second")
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

// The single objects of each kind an overlay has.

// StatefulSet returns the one StatefulSet.
func (m *Manifests) StatefulSet() (*appsv1.StatefulSet, error) {
	if len(m.StatefulSets) != 1 {
		return nil, fmt.Errorf("%d StatefulSets, want 1 (objects: %v)", len(m.StatefulSets), m.Objects)
	}
	return m.StatefulSets[0], nil
}

// Service returns the Service named name.
func (m *Manifests) Service(name string) (*corev1.Service, error) {
	for _, s := range m.Services {
		if s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no Service %q (objects: %v)", name, m.Objects)
}

// ConfigMap returns the ConfigMap named name.
func (m *Manifests) ConfigMap(name string) (*corev1.ConfigMap, error) {
	for _, c := range m.ConfigMaps {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("no ConfigMap %q (objects: %v)", name, m.Objects)
}

// Load renders the overlay with the Go API and decodes it.
func Load(root, overlay string) (*Manifests, []byte, error) {
	out, err := Render(OverlayDir(root, overlay))
	if err != nil {
		return nil, nil, err
	}
	m, err := Decode(out)
	if err != nil {
		return nil, out, fmt.Errorf("overlay %s: %w", overlay, err)
	}
	return m, out, nil
}

// appendNew appends a new, zero T to list and returns it, for the decoder to
// fill.
func appendNew[T any](list *[]*T) *T {
	o := new(T)
	*list = append(*list, o)
	return o
}
