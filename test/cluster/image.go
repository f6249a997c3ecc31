package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// File is one entry of an image layer.
type File struct {
	Name     string // path in the image, without a leading slash
	Mode     int64  // permission bits
	Dir      bool
	UID, GID int
	Data     []byte
}

// ImageConfig is the part of an image's runtime configuration the images
// of the cluster test set.
type ImageConfig struct {
	User         string              `json:"User,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Cmd          []string            `json:"Cmd,omitempty"`
	Volumes      map[string]struct{} `json:"Volumes,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	WorkingDir   string              `json:"WorkingDir,omitempty"`
}

// WriteImage writes a one-layer image named ref (e.g. salesagg:latest) in
// the format `docker save` writes (manifest.json, the config, the layer),
// which `ctr images import` reads.
func WriteImage(w io.Writer, ref string, cfg ImageConfig, files []File) error {
	layer, err := layerTar(files)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(layer)
	diffID := "sha256:" + hex.EncodeToString(sum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": goarch(),
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC(),
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history":      []map[string]any{{"created": time.Unix(0, 0).UTC(), "created_by": "salesagg test/cluster"}},
	})
	if err != nil {
		return err
	}
	csum := sha256.Sum256(config)
	configName := hex.EncodeToString(csum[:]) + ".json"
	layerName := hex.EncodeToString(sum[:]) + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{ref}, "Layers": []string{layerName}}})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerName, layer}, {"manifest.json", manifest}} {
		if dir := path.Dir(e.name); dir != "." {
			if err := tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func layerTar(files []File) ([]byte, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		name := strings.TrimPrefix(f.Name, "/")
		h := &tar.Header{Name: name, Mode: f.Mode, Uid: f.UID, Gid: f.GID, Size: int64(len(f.Data)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if f.Dir {
			h.Typeflag, h.Name, h.Size = tar.TypeDir, name+"/", 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if !f.Dir {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteImageFile is WriteImage into the file at path.
func WriteImageFile(path, ref string, cfg ImageConfig, files []File) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteImage(f, ref, cfg, files); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
