// Command mkimage builds podnet's container image without a container
// engine: one layer holding the static binaries under /bin and the CA
// bundle, an OCI image config whose entrypoint is /bin/podnet-routed, written
// as an OCI image layout in a tar file (`ctr images import`, `podman load`,
// `skopeo copy oci-archive:...` read it). The output is reproducible: entries
// are sorted, every timestamp is SOURCE_DATE_EPOCH (default 0), owners are
// 0:0, so the same binaries give the same digest.
//
// `make image` runs it. It lives in its own Go module so that the
// go-containerregistry dependency stays out of the podnet binaries' module.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("o", "bin/podnet-image.tar", "output tar file (OCI image layout)")
	binDir := flag.String("bin-dir", "bin", "directory of the built binaries")
	bins := flag.String("bins", "podnet,podnet-bridge,podnet-install,podnet-ipam,podnet-routed", "binaries to put under /bin")
	ca := flag.String("ca", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to put at /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates)")
	ref := flag.String("ref", "docker.io/podnet/podnet:dev", "image reference recorded in the layout's index")
	arch := flag.String("arch", "amd64", "GOARCH the binaries were built for")
	entrypoint := flag.String("entrypoint", "/bin/podnet-routed", "image entrypoint")
	flag.Parse()

	epoch := int64(0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
		}
		epoch = v
	}
	mtime := time.Unix(epoch, 0).UTC()

	var files []entry
	for _, b := range strings.Split(*bins, ",") {
		p := filepath.Join(*binDir, b)
		if err := checkStatic(p); err != nil {
			return err
		}
		files = append(files, entry{name: "bin/" + b, src: p, mode: 0o755})
	}
	if _, err := os.Stat(*ca); err != nil {
		return fmt.Errorf("CA bundle: %w (install Debian's ca-certificates: scripts/install-deps.sh)", err)
	}
	files = append(files, entry{name: "etc/ssl/certs/ca-certificates.crt", src: *ca, mode: 0o644})

	tmp, err := os.MkdirTemp(filepath.Dir(*out), ".mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	layerTar := filepath.Join(tmp, "layer.tar")
	if err := writeLayer(layerTar, files, mtime); err != nil {
		return err
	}
	layer, err := tarball.LayerFromFile(layerTar, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: mtime}, CreatedBy: "make image (scripts/mkimage)", Comment: "podnet static binaries + CA certificates"},
	})
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = *arch, "linux"
	cf.Created = v1.Time{Time: mtime}
	cf.Config = v1.Config{
		Entrypoint: []string{*entrypoint},
		Env:        []string{"PATH=/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		Labels: map[string]string{
			"org.opencontainers.image.title":  "podnet",
			"org.opencontainers.image.source": "https://github.com/podnet/podnet",
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}

	layoutDir := filepath.Join(tmp, "layout")
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return err
	}
	tag := *ref
	if i := strings.LastIndex(tag, ":"); i > strings.LastIndex(tag, "/") {
		tag = tag[i+1:]
	}
	if err := p.WriteImage(img); err != nil {
		return err
	}
	// index.json by hand: a plain image descriptor (go-containerregistry's
	// AppendImage also sets artifactType, which is for artifacts).
	rawManifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	index, err := json.MarshalIndent(map[string]any{
		"schemaVersion": 2,
		"mediaType":     types.OCIImageIndex,
		"manifests": []any{map[string]any{
			"mediaType": types.OCIManifestSchema1,
			"digest":    digest.String(),
			"size":      len(rawManifest),
			"annotations": map[string]string{
				"io.containerd.image.name":          *ref,
				"org.opencontainers.image.ref.name": tag,
			},
			"platform": map[string]string{"architecture": *arch, "os": "linux"},
		}},
	}, "", "  ")
	if err != nil {
		return err
	}
	if err := p.WriteFile("index.json", append(index, '\n'), 0o644); err != nil {
		return err
	}
	if err := tarDir(layoutDir, *out, mtime); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *out, *ref, digest)
	return nil
}

type entry struct {
	name string
	src  string
	mode int64
}

// checkStatic refuses dynamically linked binaries: the image has no libc.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w (run `make` first)", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build with CGO_ENABLED=0 (`make`)", path)
		}
	}
	return nil
}

// writeLayer writes the layer tar: parent directories first, all entries
// sorted by name, fixed owner and time.
func writeLayer(path string, files []entry, mtime time.Time) error {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := filepath.Dir(f.name); d != "."; d = filepath.Dir(d) {
			dirs[d+"/"] = true
		}
	}
	type item struct {
		name string
		e    *entry
	}
	var items []item
	for d := range dirs {
		items = append(items, item{name: d})
	}
	for i := range files {
		items = append(items, item{name: files[i].name, e: &files[i]})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].name < items[j].name })

	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	for _, it := range items {
		h := &tar.Header{Name: it.name, ModTime: mtime, Format: tar.FormatUSTAR}
		if it.e == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		data, err := os.ReadFile(it.e.src)
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, it.e.mode, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, bytes.NewReader(data)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return out.Close()
}

// tarDir archives the OCI layout directory reproducibly into out (written
// to a temp file and renamed).
func tarDir(dir, out string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.CreateTemp(filepath.Dir(out), ".podnet-image-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: rel, ModTime: mtime, Format: tar.FormatUSTAR}
		if fi.IsDir() {
			h.Name += "/"
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}
