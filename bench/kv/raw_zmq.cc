// raw_zmq_bench: the baseline the KV benchmark is measured against: the best
// ZeroMQ alone does for the same bytes in the same pattern. Two processes (a
// fork) talk over tcp://127.0.0.1, one I/O thread each, as ps nodes do:
//  (a) throughput: a DEALER sends a tiny header frame plus N payload bytes
//      as one zero-copy frame (zmq_msg_init_data on a page-aligned buffer
//      written before timing); the ROUTER, blocked in zmq_msg_recv, takes
//      the frames and answers a 1-byte ack; one message in flight, as
//      Push+Wait. MB/s = 1e6 payload bytes/s over the median round.
//  (b) latency: a REQ/REP round trip of one 4-byte float, the server
//      blocked in zmq_recv on the REP; median and p99 us.
// The server serves (a) and then (b), never polling two sockets at once:
// each round costs the syscalls it needs and no more. Prints one
// machine-readable line per measurement (bench/kv/run.py parses them).
// Links libzmq only.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmupRounds = 3;
constexpr int kMinRounds = 5;
constexpr int kMaxRounds = 1000000;
constexpr uint32_t kKindData = 0;
constexpr uint32_t kKindQuit = 1;
constexpr size_t kPageBytes = 4096;

size_t RoundUp(size_t bytes) {
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

struct Options {
  // 1K, 100K, 1.2M (the ConvNet) and 10M floats, in bytes.
  std::vector<size_t> bytes = {4 * 1000, 4 * 100000, 4 * 1199882, 4 * 10000000};
  double seconds = 0.5;  // per throughput cell, after warm-up
  int rtt_rounds = 2000;
};

struct Header {
  uint32_t kind;
  uint64_t bytes;
};

// This program's edge: a failed ZeroMQ call ends it, naming the call.
void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "raw_zmq_bench: %s failed: %s\n", what,
               zmq_strerror(zmq_errno()));
  std::exit(1);
}

std::string BindEphemeral(void* socket) {
  Check(zmq_bind(socket, "tcp://127.0.0.1:*") == 0, "zmq_bind");
  char endpoint[256];
  size_t len = sizeof(endpoint);
  Check(zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &len) == 0,
        "zmq_getsockopt(ZMQ_LAST_ENDPOINT)");
  return endpoint;
}

// Answers one ROUTER message: [identity][header][payload?] -> [identity][ack].
// Returns false after answering a quit.
bool AnswerRouter(void* router) {
  zmq_msg_t identity, part;
  zmq_msg_init(&identity);
  Check(zmq_msg_recv(&identity, router, 0) >= 0, "zmq_msg_recv(identity)");
  Header header{};
  bool first = true;
  bool more = true;
  while (more) {  // Header, then the payload, which the server only receives.
    zmq_msg_init(&part);
    Check(zmq_msg_recv(&part, router, 0) >= 0, "zmq_msg_recv");
    if (first && zmq_msg_size(&part) == sizeof(Header))
      std::memcpy(&header, zmq_msg_data(&part), sizeof(Header));
    first = false;
    more = zmq_msg_more(&part) != 0;
    zmq_msg_close(&part);
  }
  Check(zmq_msg_send(&identity, router, ZMQ_SNDMORE) >= 0, "zmq_msg_send");
  char ack = 'k';
  Check(zmq_send(router, &ack, 1, 0) == 1, "zmq_send(ack)");
  return header.kind != kKindQuit;
}

// The server process: binds, reports its endpoints on `out_fd`, answers
// throughput rounds until a quit, then REQ/REP round trips until an empty
// request.
void Serve(int out_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // Never outlive the client.
  void* ctx = zmq_ctx_new();
  void* router = zmq_socket(ctx, ZMQ_ROUTER);
  void* rep = zmq_socket(ctx, ZMQ_REP);
  std::string endpoints = BindEphemeral(router) + "\n" + BindEphemeral(rep);
  Check(write(out_fd, endpoints.c_str(), endpoints.size() + 1) ==
            static_cast<ssize_t>(endpoints.size() + 1),
        "write(endpoints)");
  close(out_fd);
  while (AnswerRouter(router)) {
  }
  for (;;) {
    float value = 0;
    int got = zmq_recv(rep, &value, sizeof(value), 0);
    Check(got >= 0, "zmq_recv(rep)");
    Check(zmq_send(rep, &value, static_cast<size_t>(got), 0) == got,
          "zmq_send(rep)");
    if (got == 0) break;
  }
  zmq_close(router);
  zmq_close(rep);
  zmq_ctx_term(ctx);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile99(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t i = (v.size() * 99 + 99) / 100;  // ceil(0.99 n), 1-based
  return v[std::max<size_t>(i, 1) - 1];
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One Push+Wait-like round: header + zero-copy payload, then the ack.
void SendRound(void* dealer, char* payload, size_t bytes, uint32_t kind) {
  Header header{kind, bytes};
  Check(
      zmq_send(dealer, &header, sizeof(header), ZMQ_SNDMORE) == sizeof(header),
      "zmq_send(header)");
  zmq_msg_t msg;
  // No free function: `payload` outlives the round (the ack proves receipt).
  Check(zmq_msg_init_data(&msg, payload, bytes, nullptr, nullptr) == 0,
        "zmq_msg_init_data");
  Check(zmq_msg_send(&msg, dealer, 0) >= 0, "zmq_msg_send(payload)");
  char ack;
  Check(zmq_recv(dealer, &ack, 1, 0) == 1, "zmq_recv(ack)");
}

void Throughput(void* dealer, size_t bytes, double seconds) {
  // Page-aligned and written once, so no round pays for a page fault.
  std::unique_ptr<char, decltype(&std::free)> payload(
      static_cast<char*>(std::aligned_alloc(kPageBytes, RoundUp(bytes))),
      &std::free);
  Check(payload != nullptr, "aligned_alloc");
  std::memset(payload.get(), 1, bytes);
  for (int i = 0; i < kWarmupRounds; ++i)
    SendRound(dealer, payload.get(), bytes, kKindData);
  std::vector<double> rounds;
  Clock::time_point start = Clock::now();
  while (rounds.size() < static_cast<size_t>(kMinRounds) ||
         (Seconds(start, Clock::now()) < seconds &&
          rounds.size() < static_cast<size_t>(kMaxRounds))) {
    Clock::time_point t0 = Clock::now();
    SendRound(dealer, payload.get(), bytes, kKindData);
    rounds.push_back(Seconds(t0, Clock::now()));
  }
  double median = Median(rounds);
  std::printf("raw throughput bytes=%zu rounds=%zu median_ms=%.4f mbps=%.1f\n",
              bytes, rounds.size(), median * 1e3, bytes / median / 1e6);
  std::fflush(stdout);
}

void RoundTrip(void* req, int rounds) {
  std::vector<double> us;
  float value = 1.0f;
  for (int i = 0; i < rounds + rounds / 10; ++i) {  // First 10%: warm-up.
    Clock::time_point t0 = Clock::now();
    Check(zmq_send(req, &value, sizeof(value), 0) == sizeof(value),
          "zmq_send(req)");
    Check(zmq_recv(req, &value, sizeof(value), 0) == sizeof(value),
          "zmq_recv(req)");
    if (i >= rounds / 10) us.push_back(Seconds(t0, Clock::now()) * 1e6);
  }
  std::printf("raw rtt bytes=4 rounds=%zu median_us=%.1f p99_us=%.1f\n",
              us.size(), Median(us), Percentile99(us));
  std::fflush(stdout);
}

void Client(const Options& options, const std::string& router_ep,
            const std::string& rep_ep) {
  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  void* req = zmq_socket(ctx, ZMQ_REQ);
  Check(zmq_connect(dealer, router_ep.c_str()) == 0, "zmq_connect(dealer)");
  Check(zmq_connect(req, rep_ep.c_str()) == 0, "zmq_connect(req)");
  for (size_t bytes : options.bytes) Throughput(dealer, bytes, options.seconds);
  char none = 0;
  SendRound(dealer, &none, 1, kKindQuit);
  RoundTrip(req, options.rtt_rounds);
  Check(zmq_send(req, &none, 0, 0) == 0, "zmq_send(quit)");
  Check(zmq_recv(req, &none, 1, 0) == 0, "zmq_recv(quit)");
  zmq_close(dealer);
  zmq_close(req);
  zmq_ctx_term(ctx);
}

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--bytes=B1,B2,...] [--seconds=S] "
               "[--rtt_rounds=N]\n"
               "  --bytes       payload sizes in bytes (default: 4x 1000, "
               "100000, 1199882, 10000000)\n"
               "  --seconds     time per throughput size (default 0.5)\n"
               "  --rtt_rounds  REQ/REP round trips measured (default 2000)\n",
               argv0);
  std::exit(2);
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    char* end = nullptr;
    if (name == "--bytes" && !value.empty()) {
      options.bytes.clear();
      for (const char* p = value.c_str(); *p != '\0'; p = end) {
        options.bytes.push_back(std::strtoull(p, &end, 10));
        if (end == p || options.bytes.back() == 0) Usage(argv[0]);
        if (*end == ',') ++end;
      }
    } else if (name == "--seconds" && !value.empty()) {
      options.seconds = std::strtod(value.c_str(), &end);
      if (*end != '\0' || options.seconds <= 0) Usage(argv[0]);
    } else if (name == "--rtt_rounds" && !value.empty()) {
      options.rtt_rounds = std::atoi(value.c_str());
      if (options.rtt_rounds < 10) Usage(argv[0]);
    } else {
      Usage(argv[0]);
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = ParseOptions(argc, argv);
  int fds[2];
  Check(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  Check(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    Serve(fds[1]);
    return 0;
  }
  close(fds[1]);
  char buf[600] = {};
  size_t got = 0;
  ssize_t n;
  while (got < sizeof(buf) - 1 &&
         (n = read(fds[0], buf + got, sizeof(buf) - 1 - got)) > 0)
    got += static_cast<size_t>(n);
  close(fds[0]);
  char* newline = std::strchr(buf, '\n');
  if (newline == nullptr) {
    std::fprintf(stderr,
                 "raw_zmq_bench: the server did not report its "
                 "endpoints\n");
    return 1;
  }
  Client(options, std::string(buf, newline), std::string(newline + 1));
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
