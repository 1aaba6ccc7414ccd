package boltfile

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// writeDB fills a bbolt file the way a long-lived one looks: nested and
// inline buckets, values spanning overflow pages, deletions that leave free
// pages, and many transactions.
func writeDB(t *testing.T, path string, o *bolt.Options, seed uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, o)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rng := rand.New(rand.NewPCG(seed, 1))
	for round := range 40 {
		err := db.Update(func(tx *bolt.Tx) error {
			top, err := tx.CreateBucketIfNotExists(fmt.Appendf(nil, "top-%d", round%5))
			if err != nil {
				return err
			}
			nested, err := top.CreateBucketIfNotExists([]byte("nested"))
			if err != nil {
				return err
			}
			if _, err := top.CreateBucketIfNotExists(fmt.Appendf(nil, "inline-%d", round)); err != nil {
				return err
			}
			for i := range 30 {
				size := 10 + rng.IntN(200)
				if rng.IntN(20) == 0 {
					size = 3 * (o.PageSize + 4096) // an overflow value
				}
				if err := nested.Put(fmt.Appendf(nil, "k-%05d", rng.IntN(2000)), bytes.Repeat([]byte{byte(i)}, size)); err != nil {
					return err
				}
			}
			c := nested.Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				if rng.IntN(4) == 0 {
					if err := c.Delete(); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func verifyPath(t *testing.T, path string) error {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return Verify(f)
}

// TestSoundFilesPass: files bbolt writes, with and without a persisted free
// list, at two page sizes, pass; a refused healthy file would stop csid.
func TestSoundFilesPass(t *testing.T) {
	for _, noFreelistSync := range []bool{false, true} {
		for _, pageSize := range []int{1024, 4096} {
			t.Run(fmt.Sprintf("noFreelistSync=%v/pageSize=%d", noFreelistSync, pageSize), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "x.db")
				writeDB(t, path, &bolt.Options{PageSize: pageSize, NoFreelistSync: noFreelistSync, NoSync: true}, uint64(pageSize))
				if err := verifyPath(t, path); err != nil {
					t.Fatalf("a sound file is refused: %v", err)
				}
			})
		}
	}
	t.Run("empty", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "empty.db")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := verifyPath(t, path); err != nil {
			t.Fatalf("an empty file: %v", err)
		}
	})
}

// TestDamageIsNamed: damage that made bbolt panic is refused with the page
// it is on, and errors.Is(err, ErrDamaged) holds.
func TestDamageIsNamed(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.db")
	writeDB(t, src, &bolt.Options{PageSize: 4096, NoSync: true}, 7)
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		raw  []byte
		want string
	}{
		"cut to 8192 bytes":      {raw[:8192], "truncated"},
		"cut to half":            {raw[:len(raw)/2], "truncated"},
		"both meta pages zeroed": {append(make([]byte, 8192), raw[8192:]...), "neither meta page is valid"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, "case.db")
			if err := os.WriteFile(path, c.raw, 0o600); err != nil {
				t.Fatal(err)
			}
			err := verifyPath(t, path)
			var de *Error
			if !errors.Is(err, ErrDamaged) || !errors.As(err, &de) || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Fatalf("got %v, want a damage error saying %q", err, c.want)
			}
		})
	}
}
