// dra-conformance runs kubelet's own DRA code against the agent's DRA plugin: the plugin
// manager (k8s.io/kubernetes/pkg/kubelet/pluginmanager, kubelet's watcher of its plugin
// registry directory) with the DRA manager (pkg/kubelet/cm/dra) as its DRA handler, reading
// ResourceClaims from a real API server. The plugin registers through its socket in the
// registry directory, the manager prepares and unprepares a pod's claims over the DRA gRPC
// service, and the CDI specs the plugin wrote are resolved by the CDI reference library
// (tags.cncf.io/container-device-interface) into the container edits a runtime applies.
//
// It is driven over stdin/stdout, one JSON object per line each way (stderr has kubelet's
// logs):
//
//	{"op":"start"}                           start kubelet's plugin manager and DRA manager
//	{"op":"wait_registered","driver":"D"}    wait (up to 30 s) until driver D is registered
//	{"op":"prepare","pod":{...}}             PrepareResources for the pod, then each container's
//	                                         CDI device IDs and what the CDI library makes of them
//	{"op":"resources","pod":{...}}           only the containers' CDI devices and edits
//	{"op":"unprepare","pod":{...}}           UnprepareResources for the pod
//	{"op":"health","pod":{...}}              the containers' allocatedResourcesStatus as kubelet
//	                                         sets it from the plugin's health stream
//	                                         (UpdateAllocatedResourcesStatus)
//	{"op":"wait_health_update","timeout_s":N} wait (up to N s) until the health stream changed
//	                                         a device a prepared pod holds; the pods' UIDs
//	{"op":"restart"}                         stop both managers and start new ones on the same
//	                                         directories and checkpoint (a kubelet restart)
//	{"op":"stop"}                            stop and exit
//
// Every answer has "ok"; a failure has "error" with kubelet's own message.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Set by hack/control-plane/build.sh; -version prints them (its cache check reads that).
var (
	kubernetesVersion = "unknown"
	sourceHash        = "unknown"
)

// allReady stands for kubelet's config sources: all seen.
type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

type harness struct {
	registryDir string
	stateDir    string
	cdiDir      string
	node        string
	client      kubernetes.Interface

	cancel  context.CancelFunc
	manager *dra.Manager
	// The pods kubelet would call active: every pod prepared and not unprepared.
	active map[string]*v1.Pod
}

func (h *harness) start() error {
	ctx, cancel := context.WithCancel(context.Background())
	manager, err := dra.NewManager(klog.Background(), h.client, h.stateDir)
	if err != nil {
		cancel()
		return err
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return h.client.CoreV1().Nodes().Get(ctx, h.node, metav1.GetOptions{})
	}
	if err := manager.Start(ctx, h.activePods, getNode, allReady{}); err != nil {
		cancel()
		return err
	}
	plugins := pluginmanager.NewPluginManager(h.registryDir, &record.FakeRecorder{})
	plugins.AddHandler("DRAPlugin", manager.GetWatcherHandler())
	go plugins.Run(ctx, allReady{}, ctx.Done())
	h.cancel, h.manager = cancel, manager
	return nil
}

func (h *harness) stop() {
	if h.manager == nil {
		return
	}
	h.cancel()
	h.manager.Stop()
	h.manager, h.cancel = nil, nil
}

func (h *harness) activePods() []*v1.Pod {
	pods := make([]*v1.Pod, 0, len(h.active))
	for _, p := range h.active {
		pods = append(pods, p)
	}
	return pods
}

// waitRegistered polls until kubelet's DRA manager knows the driver: the plugin watcher found
// its registration socket, asked GetInfo, validated the service version and connected to the
// DRA service.
func (h *harness) waitRegistered(driver string) error {
	plugins, ok := h.manager.GetWatcherHandler().(*draplugin.DRAPluginManager)
	if !ok {
		return errors.New("kubelet's DRA handler is not a DRAPluginManager")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := plugins.GetPlugin(driver)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type edits struct {
	Container  string   `json:"container"`
	CDIDevices []string `json:"cdi_devices"`
	// What the CDI library injects into an empty OCI spec for those devices.
	Env    map[string]string `json:"env"`
	Mounts []mount           `json:"mounts"`
}

type mount struct {
	Destination string   `json:"destination"`
	Source      string   `json:"source"`
	Options     []string `json:"options"`
}

func (h *harness) resources(pod *v1.Pod) (map[string]any, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(h.cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache: %w", err)
	}
	specErrors := []string{}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			specErrors = append(specErrors, path+": "+e.Error())
		}
	}
	sort.Strings(specErrors)
	out := []edits{}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		info, err := h.manager.GetResources(pod, c)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", c.Name, err)
		}
		e := edits{Container: c.Name, CDIDevices: []string{}, Env: map[string]string{}, Mounts: []mount{}}
		for _, d := range info.CDIDevices {
			e.CDIDevices = append(e.CDIDevices, d.Name)
		}
		if len(e.CDIDevices) > 0 {
			spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
			unresolved, err := cache.InjectDevices(spec, e.CDIDevices...)
			if err != nil {
				return nil, fmt.Errorf("container %q: CDI: %w (unresolved %v)", c.Name, err, unresolved)
			}
			for _, kv := range spec.Process.Env {
				k, v, _ := strings.Cut(kv, "=")
				e.Env[k] = v
			}
			for _, m := range spec.Mounts {
				e.Mounts = append(e.Mounts, mount{m.Destination, m.Source, m.Options})
			}
		}
		out = append(out, e)
	}
	return map[string]any{"containers": out, "spec_errors": specErrors}, nil
}

type request struct {
	Op       string  `json:"op"`
	Driver   string  `json:"driver"`
	Pod      *v1.Pod `json:"pod"`
	TimeoutS float64 `json:"timeout_s"`
}

// health is what kubelet's status manager would write for the pod: a status per
// container, filled in by the DRA manager from the health it was streamed.
func (h *harness) health(pod *v1.Pod) map[string]any {
	status := pod.Status.DeepCopy()
	status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
	}
	h.manager.UpdateAllocatedResourcesStatus(klog.Background(), pod, status)
	out := []map[string]any{}
	for _, cs := range status.ContainerStatuses {
		resources := cs.AllocatedResourcesStatus
		if resources == nil {
			resources = []v1.ResourceStatus{}
		}
		out = append(out, map[string]any{"name": cs.Name, "allocatedResourcesStatus": resources})
	}
	return map[string]any{"containers": out}
}

// waitHealthUpdate waits for the DRA manager's notice that a prepared pod's device changed
// health (what makes kubelet sync the pod's status).
func (h *harness) waitHealthUpdate(timeout time.Duration) (map[string]any, error) {
	select {
	case update := <-h.manager.Updates():
		pods := append([]string{}, update.PodUIDs...)
		sort.Strings(pods)
		return map[string]any{"pods": pods}, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("no health update within %s", timeout)
	}
}

func (h *harness) handle(req request) (map[string]any, error) {
	if req.Op != "start" && req.Op != "stop" && h.manager == nil {
		return nil, errors.New("no manager: send start first")
	}
	needPod := func() error {
		if req.Pod == nil {
			return errors.New(req.Op + " needs a pod")
		}
		return nil
	}
	ctx := context.Background()
	switch req.Op {
	case "start":
		if h.manager != nil {
			return nil, errors.New("already started")
		}
		return map[string]any{}, h.start()
	case "restart":
		h.stop()
		return map[string]any{}, h.start()
	case "wait_registered":
		return map[string]any{}, h.waitRegistered(req.Driver)
	case "prepare":
		if err := needPod(); err != nil {
			return nil, err
		}
		h.active[string(req.Pod.UID)] = req.Pod
		if err := h.manager.PrepareResources(ctx, req.Pod); err != nil {
			return nil, err
		}
		return h.resources(req.Pod)
	case "resources":
		if err := needPod(); err != nil {
			return nil, err
		}
		return h.resources(req.Pod)
	case "unprepare":
		if err := needPod(); err != nil {
			return nil, err
		}
		delete(h.active, string(req.Pod.UID))
		return map[string]any{}, h.manager.UnprepareResources(ctx, req.Pod)
	case "health":
		if err := needPod(); err != nil {
			return nil, err
		}
		return h.health(req.Pod), nil
	case "wait_health_update":
		return h.waitHealthUpdate(time.Duration(req.TimeoutS * float64(time.Second)))
	case "stop":
		h.stop()
		return map[string]any{}, nil
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}

func main() {
	dir := flag.String("dir", "", "kubelet's root for this run: plugins_registry/ and the DRA state are made in it")
	cdiDir := flag.String("cdi-dir", "", "the CDI spec directory the plugin writes (and the CDI library reads)")
	kubeconfig := flag.String("kubeconfig", "", "the API server the claims are read from")
	node := flag.String("node", "", "this kubelet's node name")
	version := flag.Bool("version", false, "print the Kubernetes version built against and the source hash")
	klog.InitFlags(nil)
	flag.Parse()
	if *version {
		fmt.Printf("dra-conformance kubelet %s source %s\n", kubernetesVersion, sourceHash)
		return
	}
	if *dir == "" || *cdiDir == "" || *kubeconfig == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "usage: dra-conformance -dir DIR -cdi-dir DIR -kubeconfig FILE -node NAME [klog flags]")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	h := &harness{
		registryDir: filepath.Join(*dir, "plugins_registry"),
		stateDir:    filepath.Join(*dir, "dra-state"),
		cdiDir:      *cdiDir,
		node:        *node,
		client:      client,
		active:      map[string]*v1.Pod{},
	}
	for _, d := range []string{h.registryDir, h.stateDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var reply map[string]any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			reply = map[string]any{"ok": false, "error": "bad request: " + err.Error()}
		} else if body, err := h.handle(req); err != nil {
			reply = map[string]any{"ok": false, "error": err.Error()}
		} else {
			body["ok"] = true
			reply = body
		}
		if err := out.Encode(reply); err != nil {
			os.Exit(1)
		}
		if req.Op == "stop" {
			return
		}
	}
	h.stop()
}
