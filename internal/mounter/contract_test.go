package mounter_test

import (
	"path/filepath"
	"testing"

	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/mounter/mountertest"
)

func TestContract(t *testing.T) {
	mountertest.Run(t, true, func(t *testing.T) mountertest.Env {
		dir, device, unreadable, regrow := mounter.SuiteEnv(t)
		return mountertest.Env{
			Mounter:    mounter.NewWithState(filepath.Join(dir, "grow")),
			Dir:        dir,
			Device:     func(_ *testing.T, size int64) string { return device(size) },
			Unreadable: func(*testing.T) string { return unreadable() },
			Regrow:     func(_ *testing.T, dev string, size int64) string { return regrow(dev, size) },
		}
	})
}
