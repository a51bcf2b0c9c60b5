// The sealed wire's sessions (docs/security.md, "Sessions"; see
// van/sealed_wire.h, and van/stream.h for what the sender keeps).
//
// On each admitted connection (a DEALER of the sender to the receiver's
// ROUTER) the sender first sends a HELLO that offers a fresh ephemeral key;
// the receiver answers on the same connection with a WELCOME that carries
// one of its own, so the session's keys come from both sides' randomness
// (seal.h, JobKey::AcceptOffer). The WELCOME also quotes what the receiver
// took of the session before on that connection, if any. Frames are then
// numbered without a gap; the receiver takes exactly the next number, and a
// gap, a repeat or a reorder makes it answer RESET: the sender offers a new
// session and sends again, in order, what the quote says was not taken.
// The receiver answers a probe (an empty sealed message) and every so many
// messages with an ACK, so the sender can let go of what was taken; a
// sender whose messages wait for an answer too long probes, and after a few
// unanswered probes starts a new session, so a deleted message (data or
// control) or a deleted answer costs a new session, not a hang.
//
// Answers go from the ROUTER (receive thread) back to the connection they
// concern; the thread "ps-van-session" reads them on every DEALER, under
// the peer's lock, and runs the senders' timers.
#include <pthread.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "van/sealed_wire.h"
#include "van/van_internal.h"

namespace ps {
namespace van_internal {

namespace {

using Clock = std::chrono::steady_clock;

// The receiver ACKs after this many messages or bytes taken since the last
// ACK, so that what the sender keeps stays bounded under steady traffic.
constexpr uint64_t kAckEveryMessages = 256;
constexpr uint64_t kAckEveryBytes = uint64_t{16} << 20;
// At most one RESET per session this often: a burst of refused messages
// (the rest of a stream after a gap) needs one.
constexpr auto kResetEvery = std::chrono::milliseconds(100);
// How long the session thread sleeps when nothing wakes it: its timers'
// resolution, and the most an answer whose wake-up was lost waits.
constexpr int kTickMs = 20;

// An answer's plaintext: its type, the session it concerns (the sender's
// offered key), and for a WELCOME the session it quotes; then a number.
std::string AnswerText(char type, const std::string& session,
                       const std::string& quoted, uint64_t taken) {
  std::string text(1, type);
  text += session;
  if (type == 'W') {
    text += quoted.empty() ? std::string(seal::kKeyBytes, '\0') : quoted;
    text += quoted.empty() ? '\0' : '\1';
  }
  text.append(reinterpret_cast<const char*>(&taken), sizeof(taken));
  return text;
}

// Seals `text` as a message of one frame: the answer's wire bytes after its
// type byte (and a WELCOME's key).
std::string SealAnswer(seal::Sealer* sealer, const std::string& text) {
  std::string sealed(seal::SealedBytes(text.size()), '\0');
  sealer->Seal(sealer->Begin(seal::Chunks(text.size())), 0, 1, text.data(),
               text.size(), &sealed[0]);
  return sealed;
}

// Opens an answer sealed by SealAnswer; empty when it does not open.
std::string OpenAnswer(seal::Opener* opener, std::string sealed) {
  seal::Opener::Frame frame{&sealed[0], sealed.size()};
  if (!opener->Open(&frame, 1).ok()) return std::string();
  return std::string(frame.data, frame.bytes);
}

}  // namespace

// ---- The sender's side (under the peer's lock) -----------------------------

Status SealedWire::OfferLocked(Peer* peer, bool again) {
  SealedPeer& s = StateOf(peer);
  if (!again || !s.offer) {
    StatusOr<seal::JobKey::Offer> offer = job_key_.MakeOffer(s.peer_key);
    if (!offer.ok()) return offer.status();
    s.offer = std::move(offer).value();
    s.out.Offer(s.offer->e.pub, Clock::now());
  }
  const std::string& hello = s.offer->hello;
  if (zmq_send(peer->socket, hello.data(), hello.size(), ZMQ_DONTWAIT) < 0) {
    return Status::Unavailable("send to " + peer->address + ": " + ZmqError());
  }
  return Status::OK();
}

Status SealedWire::TransmitLocked(Peer* peer, OutStream::Item* item) {
  SealedPeer& s = StateOf(peer);
  uint64_t last = 0;
  Status st = SendSealed(s.sealer.get(), peer->socket, peer->address,
                         item->header, item->msg, item->by_ref, &last);
  if (st.ok()) s.out.Sent(item, last, Clock::now());
  return st;
}

void SealedWire::DrainLocked(Peer* peer) {
  for (int i = 0; i < 1000; ++i) {  // bounded: the rest on the next tick
    int events = 0;
    size_t len = sizeof(events);
    if (zmq_getsockopt(peer->socket, ZMQ_EVENTS, &events, &len) != 0 ||
        (events & ZMQ_POLLIN) == 0) {
      return;
    }
    zmq_msg_t part;
    zmq_msg_init(&part);
    std::string frame;
    bool first = true, more = true;
    while (more && zmq_msg_recv(&part, peer->socket, ZMQ_DONTWAIT) >= 0) {
      if (first) frame = FrameString(&part);
      first = false;
      more = zmq_msg_more(&part) != 0;
    }
    zmq_msg_close(&part);
    if (!frame.empty()) OnAnswerLocked(peer, std::move(frame));
  }
}

void SealedWire::OnAnswerLocked(Peer* peer, std::string frame) {
  SealedPeer& s = StateOf(peer);
  const char type = frame[0];
  OutStream& out = s.out;
  if (type == '?') {
    // The receiver takes nothing of this session: it knows none of this
    // connection (it restarted), or it stopped this one for a newer HELLO
    // (whose first message was lost, or which was a replay). Unsealed, so
    // it only makes the sender offer a session; the WELCOME decides.
    if (out.state() == OutStream::State::kOpen) {
      OfferLocked(peer, false).IgnoreError();
    }
    return;
  }
  if (type == 'W' && out.state() == OutStream::State::kOffering &&
      frame.size() > 1 + seal::kKeyBytes) {
    OnWelcomeLocked(peer, frame);
    return;
  }
  if ((type != 'A' && type != 'R') || out.state() != OutStream::State::kOpen ||
      s.answers == nullptr) {
    return;
  }
  const std::string text = OpenAnswer(s.answers.get(), frame.substr(1));
  if (text.size() != 1 + seal::kKeyBytes + 8 || text[0] != type ||
      text.compare(1, seal::kKeyBytes, out.session()) != 0) {
    return;
  }
  uint64_t taken = 0;
  std::memcpy(&taken, text.data() + 1 + seal::kKeyBytes, sizeof(taken));
  if (type == 'A') {
    out.Ack(taken, Clock::now());
    return;
  }
  host_->Report("the receiver at " + peer->address +
                " refused a message out of order (it took up to " +
                std::to_string(taken) + "): starting a new session");
  OfferLocked(peer, false).IgnoreError();
}

void SealedWire::OnWelcomeLocked(Peer* peer, const std::string& frame) {
  SealedPeer& s = StateOf(peer);
  OutStream& out = s.out;
  const std::string e_pub = frame.substr(1, seal::kKeyBytes);
  StatusOr<seal::JobKey::SessionKeys> keys =
      job_key_.FinishOffer(*s.offer, s.peer_key, e_pub);
  if (!keys.ok()) return;
  auto answers = std::make_unique<seal::Opener>(keys->reverse, false);
  const std::string text =
      OpenAnswer(answers.get(), frame.substr(1 + seal::kKeyBytes));
  const size_t k = seal::kKeyBytes;
  if (text.size() != 1 + 2 * k + 1 + 8 || text[0] != 'W' ||
      text.compare(1, k, out.session()) != 0) {
    return;  // not the WELCOME of this offer
  }
  const std::string quoted = text[1 + 2 * k] ? text.substr(1 + k, k) : "";
  uint64_t taken = 0;
  std::memcpy(&taken, text.data() + 2 + 2 * k, sizeof(taken));
  const bool had = out.had_session();
  size_t lost = 0;
  std::vector<OutStream::Item*> again =
      out.Welcome(quoted, taken, Clock::now(), &lost);
  s.sealer = std::make_unique<seal::Sealer>(keys->forward);
  s.answers = std::move(answers);
  if (had && (lost > 0 || !again.empty())) {
    host_->Report("a new session to " + peer->address + ": " +
                  std::to_string(again.size()) + " messages sent again" +
                  (lost > 0 ? ", " + std::to_string(lost) +
                                  " of an earlier session it does not know "
                                  "let go (it restarted)"
                            : ""));
  }
  for (OutStream::Item* item : again) {
    if (!TransmitLocked(peer, item).ok()) break;  // the timer tries again
  }
}

void SealedWire::TickLocked(Peer* peer, Clock::time_point now) {
  SealedPeer& s = StateOf(peer);
  switch (s.out.Tick(now)) {
    case OutStream::Due::kNothing:
      return;
    case OutStream::Due::kOfferAgain:
      OfferLocked(peer, true).IgnoreError();
      return;
    case OutStream::Due::kProbe:
      ProbeLocked(peer);
      return;
    case OutStream::Due::kNewSession:
      host_->Report("no answer from " + peer->address + " to " +
                    std::to_string(OutStream::kProbesPerSession) +
                    " probes: starting a new session");
      OfferLocked(peer, false).IgnoreError();
      return;
  }
}

void SealedWire::ProbeLocked(Peer* peer) {
  // An empty sealed message: the receiver answers what it took (or, if
  // something before it is missing, RESET).
  SealedPeer& s = StateOf(peer);
  uint64_t last = 0;
  SendSealed(s.sealer.get(), peer->socket, peer->address, "", Message(), {},
             &last)
      .IgnoreError();
}

bool SealedWire::Settled(Peer* peer) {
  SealedPeer& s = StateOf(peer);
  if (s.out.size() == 0) return true;
  if (s.out.state() == OutStream::State::kOpen) ProbeLocked(peer);
  return false;
}

void SealedWire::SessionLoop() {
  std::vector<zmq_pollitem_t> items;
  while (!stop_session_.load()) {
    // Every peer of a sealed van is sealed, its descriptor set before it
    // was shared.
    const std::vector<std::shared_ptr<Peer>> peers = host_->Peers();
    items.clear();
    for (const std::shared_ptr<Peer>& peer : peers) {
      items.push_back({nullptr, peer->fd, ZMQ_POLLIN, 0});
    }
    if (zmq_poll(items.data(), static_cast<int>(items.size()), kTickMs) < 0 &&
        zmq_errno() == ETERM) {
      break;
    }
    const Clock::time_point now = Clock::now();
    for (const std::shared_ptr<Peer>& peer : peers) {
      MutexLock lock(&peer->mu);
      DrainLocked(peer.get());
      TickLocked(peer.get(), now);
    }
  }
}

// ---- The receiver's side (receive thread) ----------------------------------

void SealedWire::OnHello(const std::string& key, const std::string& hello,
                         const std::string& from, const std::string& address) {
  const std::string offered = hello.substr(8, seal::kKeyBytes);
  auto it = inbound_.find(key);
  if (it != inbound_.end()) {
    Inbound& in = it->second;
    if (in.pending && in.pending->offered == offered) {
      host_->Answer(from, in.pending->welcome);  // its WELCOME was lost
      return;
    }
    if (in.open && in.open->offered == offered) return;  // a late copy
  }
  StatusOr<seal::JobKey::Accepted> accepted =
      job_key_.AcceptOffer(static_key_, hello);
  if (!accepted.ok()) {
    Drop(from, address, "a HELLO refused: " + accepted.status().message());
    return;
  }
  Inbound& in = inbound_[key];
  // The session before takes nothing more; what it took is quoted, so the
  // sender sends again exactly the rest.
  if (in.open) in.frozen = true;
  in.stream.reset();
  Inbound::Session session;
  session.offered = offered;
  session.opener = std::make_unique<seal::Opener>(accepted->keys.forward);
  session.sealer = std::make_unique<seal::Sealer>(accepted->keys.reverse);
  const std::string quoted = in.open ? in.open->offered : "";
  const uint64_t taken = in.open ? in.open->taken : 0;
  session.welcome =
      "W" + accepted->e_pub +
      SealAnswer(session.sealer.get(), AnswerText('W', offered, quoted, taken));
  host_->Answer(from, session.welcome);
  in.pending = std::move(session);
}

void SealedWire::AnswerSession(const std::string& from,
                               Inbound::Session* session, char type) {
  const Clock::time_point now = Clock::now();
  if (type == 'R') {
    if (now - session->reset_sent < kResetEvery) return;
    session->reset_sent = now;
  } else {
    session->unacked = 0;
    session->unacked_bytes = 0;
  }
  host_->Answer(
      from, std::string(1, type) + SealAnswer(session->sealer.get(),
                                              AnswerText(type, session->offered,
                                                         "", session->taken)));
}

void SealedWire::Took(const std::string& from, Inbound::Session* session,
                      uint64_t bytes) {
  session->taken = session->opener->last();
  session->unacked_bytes += bytes;
  if (++session->unacked >= kAckEveryMessages ||
      session->unacked_bytes >= kAckEveryBytes) {
    AnswerSession(from, session, 'A');
  }
}

}  // namespace van_internal
}  // namespace ps
