package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSwappedDirectorySymlinkIsSeen: the rules file's directory is reached through a symlink
// that a deploy swaps atomically (current -> releases/v1, then current -> releases/v2, as
// Capistrano-style deploys and many config managers do). The path now names another file, with
// other content, and the new rules are in force: the watcher watches the link's directory and,
// when the link is swapped, the directory it points to now.
func TestSwappedDirectorySymlinkIsSeen(t *testing.T) {
	root := t.TempDir()
	budget := func(name string) []byte {
		return []byte("budgets:\n  - {name: " + name + ", mode: enforce, max_concurrent: 1}\n")
	}
	for _, v := range []string{"v1", "v2"} {
		if err := os.MkdirAll(filepath.Join(root, "releases", v), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "releases", v, "rules.yaml"), budget(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	current := filepath.Join(root, "current")
	if err := os.Symlink(filepath.Join("releases", "v1"), current); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, filepath.Join(current, "rules.yaml"))
	if got := h.inForce(); got != "v1:enforce" {
		t.Fatalf("in force %s", got)
	}
	tmp := filepath.Join(root, ".current.tmp")
	if err := os.Symlink(filepath.Join("releases", "v2"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, current); err != nil { // ln -sfn, atomically
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(current, "rules.yaml")); err != nil || string(data) != string(budget("v2")) {
		t.Fatalf("the path does not read the new release: %q, %v", data, err)
	}
	h.runUntilReload()
	if got := h.inForce(); got != "v2:enforce" {
		t.Fatalf("in force %s after the directory symlink was swapped to the new release; want v2:enforce", got)
	}
}
