// Package admin is csid's read-only admin endpoint: HTTP/JSON on a unix
// socket (mode 0600, `csid serve --admin-socket`, default
// <state-dir>/admin-<mode>.sock), and the client `csid inspect` and `csid
// check` use to read it.
//
// The API is GET only, versioned by path, and answers with the documents of
// package view (whose doc lists every field):
//
//	GET /v1/info                 which csid this is (mode, node, state file, pid, version)
//	GET /v1/volumes              {"volumes": [...]}; ?state=PUBLISHED&node=node-1 filter
//	GET /v1/volumes/{id}         one volume with its history; 404 when unknown
//	GET /v1/ops                  {"ops": [...]}, newest first; ?status=pending|failed&volume=ID&snapshot=ID&limit=N
//	GET /v1/ops/{seq}            one op; 404 when unknown or pruned
//	GET /v1/resizes              {"resizes": [...]}: the deferred resize queue
//	GET /v1/snapshots            {"snapshots": [...]}
//	GET /v1/snapshots/{id}       one snapshot with its history; 404 when unknown
//	GET /v1/damaged              {"records": [...]}: records that fail their checksum (reads every record)
//	GET /v1/backup               a consistent copy of the state file (application/octet-stream)
//
// Errors are {"error": "..."} with 400 (a bad parameter), 404, 405 (not
// GET) or 500. It can be read with curl:
//
//	curl -s --unix-socket /var/lib/csid/admin-node.sock http://csid/v1/volumes
//
// The server reads the store through read-only transactions only (bbolt
// refuses writes in them): nothing reached through this socket can change
// csid's state.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
)

// maxConcurrent bounds the requests served at once: each holds a read
// transaction, and a long-lived read transaction delays the growth of the
// state file.
const maxConcurrent = 4

// Handler serves the API from src.
func Handler(src view.Source, log zerolog.Logger) http.Handler {
	h := &handler{src: src, log: log, sem: make(chan struct{}, maxConcurrent)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", h.info)
	mux.HandleFunc("GET /v1/volumes", h.volumes)
	mux.HandleFunc("GET /v1/volumes/{id}", h.volume)
	mux.HandleFunc("GET /v1/ops", h.ops)
	mux.HandleFunc("GET /v1/ops/{seq}", h.op)
	mux.HandleFunc("GET /v1/resizes", h.resizes)
	mux.HandleFunc("GET /v1/snapshots", h.snapshots)
	mux.HandleFunc("GET /v1/snapshots/{id}", h.snapshot)
	mux.HandleFunc("GET /v1/damaged", h.damaged)
	mux.HandleFunc("GET /v1/backup", h.backup)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no such path %s: see GET /v1/volumes, /v1/volumes/{id}, /v1/ops, /v1/ops/{seq}, /v1/resizes, /v1/snapshots, /v1/snapshots/{id}, /v1/damaged, /v1/backup, /v1/info", r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("%s: the admin API is read-only (GET)", r.Method))
			return
		}
		select {
		case h.sem <- struct{}{}:
			defer func() { <-h.sem }()
		case <-r.Context().Done():
			return
		}
		start := time.Now()
		mux.ServeHTTP(w, r)
		h.log.Debug().Str("path", r.URL.RequestURI()).Float64("took_seconds", time.Since(start).Seconds()).Msg("admin request")
	})
}

type handler struct {
	src view.Source
	log zerolog.Logger
	sem chan struct{}
}

func (h *handler) info(w http.ResponseWriter, r *http.Request) {
	out, err := h.src.Info(r.Context())
	reply(w, out, err)
}

func (h *handler) volumes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := view.VolumeFilter{State: fsm.State(q.Get("state")), Node: q.Get("node")}
	if err := view.CheckState(f.State); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	out, err := h.src.Volumes(r.Context(), f)
	reply(w, out, err)
}

func (h *handler) volume(w http.ResponseWriter, r *http.Request) {
	out, err := h.src.Volume(r.Context(), r.PathValue("id"))
	reply(w, out, err)
}

func (h *handler) ops(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := view.OpFilter{Status: view.OpSelect(q.Get("status")), VolumeID: q.Get("volume"), SnapshotID: q.Get("snapshot")}
	if err := view.CheckOpSelect(f.Status); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("limit %q: want a number, 0 for no limit", s))
			return
		}
		f.Limit = n
	}
	out, err := h.src.Ops(r.Context(), f)
	reply(w, out, err)
}

func (h *handler) op(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("op %q: want a sequence number", r.PathValue("seq")))
		return
	}
	out, err := h.src.Op(r.Context(), seq)
	reply(w, out, err)
}

func (h *handler) resizes(w http.ResponseWriter, r *http.Request) {
	out, err := h.src.Resizes(r.Context())
	reply(w, out, err)
}

func (h *handler) snapshots(w http.ResponseWriter, r *http.Request) {
	out, err := h.src.Snapshots(r.Context())
	reply(w, out, err)
}

func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) {
	out, err := h.src.Snapshot(r.Context(), r.PathValue("id"))
	reply(w, out, err)
}

func (h *handler) damaged(w http.ResponseWriter, r *http.Request) {
	out, err := h.src.Damaged(r.Context())
	reply(w, out, err)
}

// backupTimeout bounds the writing of a backup (the server's write timeout
// is for small answers).
const backupTimeout = 10 * time.Minute

// backup streams a consistent copy of the state file. An error after the
// first bytes cuts the stream short, which the client sees: it checks the
// copy it wrote before it says it is done.
func (h *handler) backup(w http.ResponseWriter, r *http.Request) {
	b, ok := h.src.(interface {
		Backup(ctx context.Context, w io.Writer) (int64, error)
	})
	if !ok {
		writeError(w, http.StatusNotFound, errors.New("this csid cannot write a backup"))
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(backupTimeout))
	w.Header().Set("Content-Type", "application/octet-stream")
	sw := &startedWriter{w: w}
	n, err := b.Backup(r.Context(), sw)
	switch {
	case err != nil && !sw.started:
		writeError(w, http.StatusInternalServerError, err)
	case err != nil:
		h.log.Error().Err(err).Int64("bytes", n).Msg("backup cut short")
		panic(http.ErrAbortHandler) // the client sees the stream broken, not a short file
	default:
		h.log.Info().Int64("bytes", n).Msg("backup written")
	}
}

// startedWriter records whether anything was written.
type startedWriter struct {
	w       io.Writer
	started bool
}

func (s *startedWriter) Write(p []byte) (int, error) {
	s.started = true
	return s.w.Write(p)
}

// errorBody is the body of every error answer.
type errorBody struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, v any, err error) {
	switch {
	case errors.Is(err, view.ErrNotFound):
		writeError(w, http.StatusNotFound, err)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, errorBody{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		code, body = http.StatusInternalServerError, []byte(`{"error":"encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

// Server is the admin endpoint on a listener.
type Server struct {
	srv  *http.Server
	done chan struct{}
}

// Serve serves the API from src on lis until Close. It returns at once.
func Serve(lis net.Listener, src view.Source, log zerolog.Logger) *Server {
	s := &Server{
		srv: &http.Server{
			Handler:           Handler(src, log),
			ReadHeaderTimeout: 5 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       30 * time.Second,
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("admin endpoint stopped")
		}
	}()
	return s
}

// Close stops the endpoint: requests in progress get until ctx ends to
// finish, then their connections are closed. It removes the socket file.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	<-s.done
	return err
}
