use super::*;

#[test]
fn codes_and_names_round_trip() {
    for s in [
        AccessState::ActiveOptimized,
        AccessState::ActiveNonOptimized,
        AccessState::Standby,
        AccessState::Unavailable,
        AccessState::Offline,
        AccessState::Transitioning,
    ] {
        assert_eq!(AccessState::from_code(s.code()), Some(s));
        assert_eq!(AccessState::parse(s.name()), Some(s));
    }
    assert_eq!(AccessState::from_code(4), None);
    assert_eq!(AccessState::parse("active"), None);
}

#[test]
fn each_state_lets_through_what_spc4_lists() {
    let inquiry = [0x12u8, 0, 0, 0, 36, 0];
    let rtpg = [0xa3u8, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let stpg = [0xa4u8, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
    let mode_sense = [0x1au8, 0, 0x3f, 0, 0xff, 0];
    let prin = [0x5eu8, 0, 0, 0, 0, 0, 0, 0, 8, 0];
    let read = [0x28u8, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let tur = [0u8; 6];
    let echo = [0x3cu8, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0];
    use AccessState::*;
    for (state, cdb, ok) in [
        (Standby, &inquiry[..], true),
        (Standby, &rtpg[..], true),
        (Standby, &stpg[..], true),
        (Standby, &mode_sense[..], true),
        (Standby, &prin[..], true),
        (Standby, &echo[..], true),
        (Standby, &read[..], false),
        (Standby, &tur[..], false),
        (Unavailable, &inquiry[..], true),
        (Unavailable, &stpg[..], true),
        (Unavailable, &mode_sense[..], false),
        (Unavailable, &prin[..], false),
        (Transitioning, &rtpg[..], true),
        (Transitioning, &stpg[..], false),
        (Transitioning, &read[..], false),
        (ActiveNonOptimized, &read[..], true),
    ] {
        assert_eq!(allowed(state, cdb), ok, "{state:?} {:02x?}", &cdb[..2]);
    }
}

#[test]
fn an_all_active_lu_checks_nothing() {
    let a = Alua::new(&AluaConfig::default());
    assert_eq!(a.refuses(1, &[0x28; 10]), None);
    assert_eq!(a.state(7), AccessState::ActiveOptimized);
}
