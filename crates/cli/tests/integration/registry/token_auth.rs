//! `foliofs pull` from a docker-registry with token auth, as registries
//! on the internet have it: a 401 sends the client to the token service
//! the challenge names, and the bearer token it gets is what the registry
//! takes, until it expires.

use std::path::Path;
use std::time::{Duration, Instant};

use foliofs_testkit::proxy::{Fault, FaultProxy};

use super::pull::{mount, one_line_error};
use super::token::{Policy, TokenServer};
use super::{auth_file, foliofs, pull, push, store_traces, Registry};
use crate::common;
use crate::erofs::walk::{assert_same, walk_mounted};
use crate::image::umoci::umoci_image;
use crate::image::{comparable, user_listing};

const USER: &str = "puller";
const PASS: &str = "t0ken-s3cret";

/// A token service for [`USER`], granting anonymous pulls if `anonymous`,
/// and a registry taking its tokens with the umoci image of `dir` pushed
/// to `REPO:t` (with the user's credentials: a push needs them).
fn token_registry(dir: &Path, repo: &str, anonymous: bool) -> (TokenServer, Registry) {
    let tokens = TokenServer::start(Policy {
        user: (USER.into(), PASS.into()),
        anonymous_pull: anonymous,
    });
    let reg = Registry::with_tokens(&tokens);
    push(
        &dir.join("L"),
        "t",
        &format!("docker://{}/{repo}:t", reg.host()),
        &["--dest-creds", &format!("{USER}:{PASS}")],
    );
    (tokens, reg)
}

/// Asserts `out` succeeded.
fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `store`'s image of `reference` mounted, against `umoci unpack` in
/// `dir`.
fn assert_mount_is_umocis(dir: &Path, store: &Path, auth: Option<&Path>, reference: &str) {
    let want = comparable(walk_mounted(&dir.join("U/rootfs")));
    let m = mount(store, auth, reference);
    let got = walk_mounted(m.path());
    m.unmount().unwrap();
    assert_same(
        &format!("foliofs's mount of {reference}, against umoci unpack"),
        &want,
        &comparable(got),
    );
}

#[test]
fn an_image_behind_token_auth_is_pulled_with_the_auth_files_credentials() {
    require!(
        "root",
        "fuse",
        "user-fuse",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo",
        "openssl"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let (tokens, reg) = token_registry(tmp.path(), "private/img", false);
    let reference = format!("docker://{}/private/img:t", reg.host());
    let store = tmp.path().join("store");

    // No credentials: the token service refuses, and the pull says so in
    // one line naming the registry's host.
    let refused = tokens.refused();
    let err = one_line_error(&pull(&store, None, &reference, &[]));
    assert!(err.contains(&reg.host()), "{err}");
    assert!(
        err.contains("token service") && err.contains("wants credentials"),
        "{err}"
    );
    assert!(tokens.refused() > refused);
    // Wrong ones: refused, naming the file they came from.
    let wrong = tmp.path().join("wrong.json");
    auth_file(&wrong, &reg.host(), USER, "nope");
    let err = one_line_error(&pull(&store, Some(&wrong), &reference, &[]));
    assert!(
        err.contains("refused") && err.contains("wrong.json"),
        "{err}"
    );
    assert!(store_traces(&store, "")
        .iter()
        .all(|n| !n.starts_with("layer-")));

    // The right ones, from REGISTRY_AUTH_FILE.
    let good = tmp.path().join("auth.json");
    auth_file(&good, &reg.host(), USER, PASS);
    let issued = tokens.issued();
    ok(&pull(&store, Some(&good), &reference, &[]));
    assert!(tokens.issued() > issued, "no token was asked for");
    assert_mount_is_umocis(tmp.path(), &store, Some(&good), &reference);

    // The user `tests` pulls and mounts it with an auth file of their
    // own, into a store of their own.
    common::open_to_all(tmp.path());
    common::sh_in(tmp.path(), "chmod a+rx U");
    let home = common::user_tempdir(common::TEST_USER);
    let mnt = common::user_tempdir(common::TEST_USER);
    let user_auth = home.path().join("auth.json");
    auth_file(&user_auth, &reg.host(), USER, PASS);
    let (uid, gid) = common::user_ids(common::TEST_USER).unwrap();
    std::os::unix::fs::chown(&user_auth, Some(uid), Some(gid)).unwrap();
    let user_env = |cmd: &mut std::process::Command, auth: &Path| {
        cmd.arg(format!("XDG_CACHE_HOME={}", home.path().display()))
            .arg(format!("HOME={}", home.path().display()))
            .arg(format!("REGISTRY_AUTH_FILE={}", auth.display()))
            .arg(common::bin());
    };
    // Without their credentials (an auth file naming no host) they are
    // refused as root was.
    let empty = home.path().join("empty.json");
    std::fs::write(&empty, "{\"auths\": {}}\n").unwrap();
    std::os::unix::fs::chown(&empty, Some(uid), Some(gid)).unwrap();
    let mut cmd = common::user_command(common::TEST_USER, "env");
    user_env(&mut cmd, &empty);
    cmd.args(["pull", "--tls-verify=false", &reference]);
    let err = one_line_error(&common::run_timeout(&mut cmd, Duration::from_secs(300)));
    assert!(
        err.contains(&reg.host()) && err.contains("wants credentials"),
        "{err}"
    );
    let mut cmd = common::user_command(common::TEST_USER, "env");
    user_env(&mut cmd, &user_auth);
    cmd.args(["pull", "--tls-verify=false", &reference]);
    ok(&common::run_timeout(&mut cmd, Duration::from_secs(300)));
    let mut cmd = common::user_command(common::TEST_USER, "env");
    user_env(&mut cmd, &user_auth);
    cmd.args(["mount", "--tls-verify=false", &reference])
        .arg(mnt.path());
    let m = common::Mount::by_command(Some(common::TEST_USER), &mut cmd, mnt.path()).unwrap();
    assert_eq!(
        user_listing(m.path()),
        user_listing(&tmp.path().join("U/rootfs")),
        "a user's mount of the image pulled with their token, against umoci unpack"
    );
    m.unmount().unwrap();
}

#[test]
fn an_anonymous_pull_works_when_the_token_service_grants_it() {
    require!(
        "root",
        "fuse",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo",
        "openssl"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let (tokens, reg) = token_registry(tmp.path(), "public/img", true);
    let reference = format!("docker://{}/public/img:t", reg.host());
    let store = tmp.path().join("store");
    let (issued, refused) = (tokens.issued(), tokens.refused());
    ok(&pull(&store, None, &reference, &[]));
    assert!(tokens.issued() > issued, "no token was asked for");
    assert_eq!(tokens.refused(), refused);
    assert_mount_is_umocis(tmp.path(), &store, None, &reference);
}

#[test]
fn a_token_that_expires_between_requests_is_renewed() {
    require!(
        "root",
        "fuse",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo",
        "openssl"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let (tokens, reg) = token_registry(tmp.path(), "expiring/img", false);
    let auth = tmp.path().join("auth.json");
    // Through a proxy that answers every request 2.5 s late, with tokens
    // good for at most 2 s: each request after the first meets a 401 for
    // a token that was good when the one before it started.
    let proxy = FaultProxy::start(&reg.endpoint()).unwrap();
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    auth_file(&auth, &host, USER, PASS);
    let reference = format!("docker://{host}/expiring/img:t");
    tokens.set_valid_for(Duration::from_secs(2));
    proxy.set(Fault::Delay(Duration::from_millis(2500)));
    let store = tmp.path().join("store");
    let issued = tokens.issued();
    let start = Instant::now();
    ok(&pull(&store, Some(&auth), &reference, &[]));
    // The manifest, the config and three layers: a token for each.
    let renewed = tokens.issued() - issued;
    assert!(
        renewed >= 5,
        "{renewed} tokens in {:?} of a pull that took a request per 2.5 s",
        start.elapsed()
    );
    tokens.set_valid_for(Duration::from_secs(300));
    proxy.set(Fault::None);
    assert_mount_is_umocis(tmp.path(), &store, Some(&auth), &reference);

    // A token service whose tokens are stale when issued: the retry with
    // the new one is refused too, and the pull gives up in one line
    // rather than asking again and again.
    tokens.set_valid_for(Duration::ZERO);
    let issued = tokens.issued();
    let err = one_line_error(&pull(
        &tmp.path().join("store2"),
        Some(&auth),
        &reference,
        &[],
    ));
    assert!(
        err.contains("refused the token") && err.contains(&host),
        "{err}"
    );
    assert!(
        tokens.issued() - issued <= 2,
        "{}",
        tokens.issued() - issued
    );
}

#[test]
fn a_blob_resumed_after_its_token_expired_gets_a_new_token() {
    require!(
        "root",
        "fuse",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo",
        "openssl"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let (tokens, reg) = token_registry(tmp.path(), "resumed/img", false);
    let auth = tmp.path().join("auth.json");
    let proxy = FaultProxy::start(&reg.endpoint()).unwrap();
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    auth_file(&auth, &host, USER, PASS);
    let reference = format!("docker://{host}/resumed/img:t");
    // The first blob stalls half-way; while it does, the token it was
    // asked for with expires, and then the connection is closed: the
    // blob's Range request for its rest meets a 401 (the registry checks
    // the token of every request), so the pull succeeds only if that
    // request is answered with a new token.
    tokens.set_valid_for(Duration::from_secs(2));
    proxy.set(Fault::Stall);
    let store = tmp.path().join("store");
    // Its log says when a blob is resumed.
    let mut child = foliofs(&store, Some(&auth))
        .env("RUST_LOG", "info")
        .args(["pull", "--tls-verify=false", &reference])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stalled = common::wait_until(Duration::from_secs(60), || proxy.faulted() >= 1);
    let issued = tokens.issued();
    std::thread::sleep(Duration::from_millis(2500));
    proxy.set(Fault::None);
    let done = common::wait_until(Duration::from_secs(120), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !done {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(stalled, "no blob reached the proxy");
    assert!(done, "the pull did not end within 120 s");
    ok(&out);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("resuming at byte"), "{log}");
    assert!(
        tokens.issued() > issued,
        "the resumed blob was fetched without a new token"
    );
    tokens.set_valid_for(Duration::from_secs(300));
    assert_mount_is_umocis(tmp.path(), &store, Some(&auth), &reference);
}

/// `foliofs push` behind token auth: without credentials the token
/// service refuses and nothing is published; with the auth file's, the
/// token it gets for `pull,push` takes every upload, and the index pushed
/// is the one skopeo then reads back with the same credentials.
#[test]
fn foliofs_push_behind_token_auth_takes_the_auth_files_credentials() {
    require!(
        "root",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo",
        "openssl"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let (tokens, reg) = token_registry(tmp.path(), "private/img", false);
    let dest = format!("docker://{}/native/img:t", reg.host());
    let layout = format!("oci:{}:t", tmp.path().join("L").display());
    let store = tmp.path().join("store");
    let push_with = |auth: Option<&Path>| {
        common::run_timeout(
            foliofs(&store, auth).args(["push", "--tls-verify=false", &layout, &dest]),
            Duration::from_secs(300),
        )
    };
    let refused = tokens.refused();
    let err = one_line_error(&push_with(None));
    assert!(
        err.contains(&reg.host()) && err.contains("wants credentials"),
        "{err}"
    );
    assert!(tokens.refused() > refused);
    let auth = tmp.path().join("auth.json");
    auth_file(&auth, &reg.host(), USER, PASS);
    let issued = tokens.issued();
    let out = push_with(Some(&auth));
    ok(&out);
    assert!(tokens.issued() > issued);
    let index = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let raw = common::run_timeout(
        std::process::Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            "--creds",
            &format!("{USER}:{PASS}"),
            &dest,
        ]),
        Duration::from_secs(60),
    );
    ok(&raw);
    use sha2::Digest as _;
    let got = format!("sha256:{:x}", sha2::Sha256::digest(&raw.stdout));
    assert_eq!(got, index, "the index skopeo reads is the one pushed");
}
