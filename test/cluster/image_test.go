package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// TestWriteImage: the tarball is what `docker save` writes: manifest.json
// naming the tag, the config and the layer, the config's diff_id the
// layer's digest, the layer holding the files with their owners and modes.
func TestWriteImage(t *testing.T) {
	var buf bytes.Buffer
	files := []File{{Name: "bin", Dir: true, Mode: 0o755}, {Name: "bin/x", Mode: 0o755, Data: []byte("x"), UID: 65532, GID: 65532}}
	if err := WriteImage(&buf, "salesagg:latest", ImageConfig{User: "65532:65532", Entrypoint: []string{"/bin/x"}}, files); err != nil {
		t.Fatal(err)
	}
	entries := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		entries[h.Name] = b
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, entries["manifest.json"])
	}
	m := manifest[0]
	if len(m.RepoTags) != 1 || m.RepoTags[0] != "salesagg:latest" || len(m.Layers) != 1 {
		t.Fatalf("manifest: %+v", m)
	}
	var cfg struct {
		Config ImageConfig
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(entries[m.Config], &cfg); err != nil {
		t.Fatal(err)
	}
	layer := entries[m.Layers[0]]
	sum := sha256.Sum256(layer)
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("diff_ids %v, layer digest %x", cfg.RootFS.DiffIDs, sum)
	}
	if cfg.Config.User != "65532:65532" || strings.Join(cfg.Config.Entrypoint, " ") != "/bin/x" {
		t.Errorf("config %+v", cfg.Config)
	}
	lr := tar.NewReader(bytes.NewReader(layer))
	var got []string
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name+" "+h.FileInfo().Mode().String()+" "+string(rune('0'+h.Uid%10)))
	}
	if strings.Join(got, ",") != "bin/ drwxr-xr-x 0,bin/x -rwxr-xr-x 2" {
		t.Errorf("layer entries %q", got)
	}
}
