// The processes `cluster up` and the cluster tests start: a child spawned (as another user if
// asked), waited on and stopped, and the small helpers around it (a free port, a log's tail).
// The servers themselves are in local_servers.cpp.

#include "cluster/local_servers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace armada::cluster {

namespace {

int status_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

}  // namespace

std::optional<Child> Child::spawn(const std::vector<std::string> & argv, const std::string & log,
                                  const std::string & as_user, std::string & error,
                                  const std::vector<std::string> & env) {
    if (argv.empty()) {
        error = "no command";
        return std::nullopt;
    }
    uid_t uid = 0;
    gid_t gid = 0;
    const bool switch_user = !as_user.empty() && ::geteuid() == 0;
    if (switch_user) {
        const passwd * pw = ::getpwnam(as_user.c_str());
        if (!pw) {
            error = "no user '" + as_user + "' to run " + argv[0] + " as";
            return std::nullopt;
        }
        uid = pw->pw_uid;
        gid = pw->pw_gid;
    }
    // Root's alone: a server may write a failed statement, or a setting, into its log.
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        error = "cannot open " + log + ": " + std::strerror(errno);
        return std::nullopt;
    }
    if (switch_user && ::fchown(fd, uid, gid) != 0) {
        // Still usable: the child writes through the descriptor it inherits.
    }
    std::vector<char *> args;
    for (const auto & a : argv)
        args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    // The environment is built before the fork: the child only calls async-signal-safe functions.
    std::vector<char *> envp;
    for (char ** e = environ; e && *e; ++e) {
        const std::string_view kv(*e);
        const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string & x) {
            const size_t eq = x.find('=');
            return eq != std::string::npos && kv.substr(0, eq + 1) == std::string_view(x).substr(0, eq + 1);
        });
        if (!replaced) envp.push_back(*e);
    }
    for (const auto & x : env)
        envp.push_back(const_cast<char *>(x.c_str()));
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
        error = std::string("fork: ") + std::strerror(errno);
        ::close(fd);
        return std::nullopt;
    }
    if (pid == 0) {
        // The child: its own process group, so a terminal's Ctrl-C reaches the parent only and
        // servers stop in the order the parent chooses.
        ::setpgid(0, 0);
        // A parent that takes its stop signals with sigwait has them blocked, and a blocked mask
        // survives exec: a server would never see the SIGINT that stops it.
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        const int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, 0);
        if (switch_user) {
            if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) _exit(126);
        }
        ::execve(args[0], args.data(), envp.data());
        const std::string msg = std::string("exec ") + args[0] + ": " + std::strerror(errno) + "\n";
        if (::write(2, msg.data(), msg.size()) < 0) _exit(127);
        _exit(127);
    }
    ::close(fd);
    Child c;
    c.pid_ = pid;
    return c;
}

Child::Child(Child && o) noexcept : pid_(o.pid_), status_(o.status_), exited_(o.exited_) {
    o.pid_ = -1;
}

Child & Child::operator=(Child && o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(status_, o.status_);
    std::swap(exited_, o.exited_);
    return *this;
}

Child::~Child() {
    if (pid_ > 0 && running()) stop(SIGKILL, 5000);
}

bool Child::running() {
    if (pid_ <= 0 || exited_) return false;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
        exited_ = true;
        status_ = st;
        return false;
    }
    return r == 0;
}

int Child::exit_code() const {
    return exited_ ? status_code(status_) : -1;
}

void Child::signal(int sig) const {
    if (pid_ > 0 && !exited_) ::kill(pid_, sig);
}

int Child::wait(int wait_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (running()) {
        if (std::chrono::steady_clock::now() >= until) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exited_ ? status_code(status_) : -1;
}

int Child::stop(int sig, int wait_ms) {
    if (!running()) return exited_ ? status_code(status_) : -1;
    signal(sig);
    int code = wait(wait_ms);
    if (code < 0 && running()) {
        signal(SIGKILL);
        code = wait(10000);
    }
    return code;
}

int run_command(const std::vector<std::string> & argv, const std::string & log, const std::string & as_user,
                std::string & error) {
    auto c = Child::spawn(argv, log, as_user, error);
    if (!c) return -1;
    return c->wait(600000);
}

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    ::close(fd);
    return port;
}

std::string tail_of(const std::string & path, size_t n) {
    std::ifstream f(path, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    return s.size() > n ? s.substr(s.size() - n) : s;
}

}  // namespace armada::cluster
