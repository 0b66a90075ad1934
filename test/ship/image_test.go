package ship

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestImageReproducible runs `make image` twice: same manifest digest, same
// tarball bytes. The one layer holds exactly the static binaries and the
// CA bundle; the config's entrypoint is podnet-routed.
func TestImageReproducible(t *testing.T) {
	root := repo(t)
	tarPath := filepath.Join(root, "bin", "podnet-image.tar")
	var digests, sums []string
	for i := 0; i < 2; i++ {
		out := run(t, true, "make", "--no-print-directory", "image")
		m := regexp.MustCompile(`(?m)^bin/podnet-image\.tar (\S+) (sha256:[0-9a-f]{64})$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("make image printed no digest:\n%s", out)
		}
		digests = append(digests, m[2])
		sum := sha256.Sum256(readFile(t, tarPath))
		sums = append(sums, hex.EncodeToString(sum[:]))
		t.Logf("make image #%d: %s %s (tarball sha256 %s)", i+1, m[1], m[2], sums[i])
	}
	if digests[0] != digests[1] || sums[0] != sums[1] {
		t.Fatalf("not reproducible: digests %v, tarball sums %v", digests, sums)
	}

	blobs, index := readLayout(t, tarPath)
	var idx struct {
		Manifests []struct {
			MediaType   string            `json:"mediaType"`
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	mustJSON(t, index, &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Digest != digests[0] || idx.Manifests[0].MediaType != "application/vnd.oci.image.manifest.v1+json" {
		t.Fatalf("index.json %s, want one OCI manifest %s", index, digests[0])
	}
	if ref := idx.Manifests[0].Annotations["io.containerd.image.name"]; !strings.HasSuffix(ref, "podnet/podnet:"+imageVersion(t)) {
		t.Errorf("image name %q, want .../podnet/podnet:%s", ref, imageVersion(t))
	}
	var man struct {
		Config struct{ Digest string } `json:"config"`
		Layers []struct {
			MediaType, Digest string
		} `json:"layers"`
	}
	mustJSON(t, blob(t, blobs, digests[0]), &man)
	var cfg struct {
		Architecture, OS string
		Config           struct{ Entrypoint, Cmd []string }
		RootFS           struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	mustJSON(t, blob(t, blobs, man.Config.Digest), &cfg)
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/bin/podnet-routed"}) || cfg.OS != "linux" {
		t.Errorf("config: entrypoint %v os %s, want [/bin/podnet-routed] linux", cfg.Config.Entrypoint, cfg.OS)
	}
	if len(man.Layers) != 1 || len(cfg.RootFS.DiffIDs) != 1 {
		t.Fatalf("%d layers / %d diff_ids, want 1", len(man.Layers), len(cfg.RootFS.DiffIDs))
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(t, blobs, man.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if d := sha256.Sum256(layer); "sha256:"+hex.EncodeToString(d[:]) != cfg.RootFS.DiffIDs[0] {
		t.Error("layer diff_id does not match its content")
	}

	want := map[string][]byte{"etc/ssl/certs/ca-certificates.crt": readFile(t, "/etc/ssl/certs/ca-certificates.crt")}
	for _, b := range []string{"podnet", "podnet-bridge", "podnet-install", "podnet-ipam", "podnet-routed"} {
		want["bin/"+b] = readFile(t, root, "bin", b)
	}
	got := map[string][]byte{}
	var names, dirs []string
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("%s: owner %d:%d mtime %v, want 0:0 at the epoch", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			dirs = append(dirs, h.Name)
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			got[h.Name] = data
			if strings.HasPrefix(h.Name, "bin/") && h.Mode != 0o755 {
				t.Errorf("%s mode %o", h.Name, h.Mode)
			}
		default:
			t.Errorf("unexpected entry %s type %c", h.Name, h.Typeflag)
		}
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("layer entries not sorted: %v", names)
	}
	if !slices.Equal(dirs, []string{"bin/", "etc/", "etc/ssl/", "etc/ssl/certs/"}) {
		t.Errorf("directories %v, want only the parents of the files", dirs)
	}
	if len(got) != len(want) {
		t.Errorf("layer files %v, want exactly %d (binaries + CA bundle)", names, len(want))
	}
	for name, data := range want {
		if !bytes.Equal(got[name], data) {
			t.Errorf("layer %s: %d bytes, differs from %d bytes on disk", name, len(got[name]), len(data))
		}
	}
}

// readLayout reads an OCI layout tar: blobs by digest (each checked
// against its content) and index.json.
func readLayout(t *testing.T, path string) (map[string][]byte, []byte) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	var index []byte
	var layout bool
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.Name == "index.json":
			index = data
		case h.Name == "oci-layout":
			layout = bytes.Contains(data, []byte(`"imageLayoutVersion"`))
		case strings.HasPrefix(h.Name, "blobs/sha256/"):
			d := sha256.Sum256(data)
			if hex.EncodeToString(d[:]) != strings.TrimPrefix(h.Name, "blobs/sha256/") {
				t.Errorf("blob %s does not match its digest", h.Name)
			}
			blobs["sha256:"+strings.TrimPrefix(h.Name, "blobs/sha256/")] = data
		default:
			t.Errorf("unexpected file %s in the image tarball", h.Name)
		}
	}
	if index == nil || !layout {
		t.Fatalf("%s is not an OCI image layout (index.json, oci-layout)", path)
	}
	return blobs, index
}

func blob(t *testing.T, blobs map[string][]byte, digest string) []byte {
	t.Helper()
	b, ok := blobs[digest]
	if !ok {
		t.Fatalf("blob %s missing", digest)
	}
	return b
}

func mustJSON(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%v in %s", err, data)
	}
}

func imageVersion(t *testing.T) string {
	m := regexp.MustCompile(`(?m)^IMAGE_VERSION\s*\?=\s*(\S+)`).FindSubmatch(readFile(t, repo(t), "Makefile"))
	if m == nil {
		t.Fatal("IMAGE_VERSION not in Makefile")
	}
	return string(m[1])
}
