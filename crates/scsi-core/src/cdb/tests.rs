use super::*;
use crate::SenseKey;
use proptest::prelude::*;

#[test]
fn read10_fields() {
    let cdb = [0x28, 0x18, 0, 0, 0x12, 0x34, 0x05, 0, 8, 0];
    let c = Command::parse(&cdb).unwrap();
    let Command::Read(io) = c else {
        panic!("{c:?}")
    };
    assert_eq!(io.lba, 0x1234);
    assert_eq!(io.blocks, 8);
    assert!(io.dpo && io.fua && !io.rarc);
    assert_eq!(io.group, 5);
    let mut out = [0u8; 16];
    assert_eq!(c.emit(&mut out), Ok(10));
    assert_eq!(&out[..10], &cdb);
}

#[test]
fn read6_zero_means_256() {
    let c = Command::parse(&[0x08, 0x01, 0x02, 0x03, 0, 0]).unwrap();
    let Command::Read(io) = c else { panic!() };
    assert_eq!((io.lba, io.blocks), (0x10203, 256));
    assert_eq!(c.encode().as_ref(), &[0x08, 0x01, 0x02, 0x03, 0, 0]);
}

#[test]
fn padded_cdb_is_accepted() {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x00;
    assert_eq!(
        Command::parse(&cdb),
        Ok(Command::TestUnitReady { control: 0 })
    );
}

#[test]
fn refusals_carry_field_pointers() {
    assert_eq!(Command::parse(&[]), Err(CdbError::Empty));
    assert_eq!(
        Command::parse(&[0xff, 0, 0, 0, 0, 0]),
        Err(CdbError::InvalidOpcode { opcode: 0xff })
    );
    assert_eq!(
        Command::parse(&[0x28, 0, 0]),
        Err(CdbError::Truncated { needed: 10, got: 3 })
    );
    // READ(10) obsolete bit 1 of byte 1.
    assert_eq!(
        Command::parse(&[0x28, 0x02, 0, 0, 0, 0, 0, 0, 1, 0]),
        Err(CdbError::InvalidField {
            byte: 1,
            bit: Some(1)
        })
    );
    // NACA in the control byte.
    assert_eq!(
        Command::parse(&[0x00, 0, 0, 0, 0, 0x04]),
        Err(CdbError::InvalidField {
            byte: 5,
            bit: Some(2)
        })
    );
    // Unknown SERVICE ACTION IN(16) service action.
    let mut sai = [0u8; 16];
    sai[0] = 0x9e;
    sai[1] = 0x1f;
    assert_eq!(
        Command::parse(&sai),
        Err(CdbError::InvalidServiceAction {
            opcode: 0x9e,
            service_action: 0x1f
        })
    );
    // VERIFY BYTCHK=10b is reserved.
    assert_eq!(
        Command::parse(&[0x2f, 0x04, 0, 0, 0, 0, 0, 0, 1, 0]),
        Err(CdbError::InvalidField {
            byte: 1,
            bit: Some(2)
        })
    );
}

#[test]
fn errors_map_to_sense() {
    let s: Sense = CdbError::InvalidOpcode { opcode: 0xff }.into();
    assert_eq!(s.key, SenseKey::ILLEGAL_REQUEST);
    assert_eq!(s.asc, asc::INVALID_COMMAND_OPERATION_CODE);
    let s: Sense = CdbError::InvalidField {
        byte: 1,
        bit: Some(3),
    }
    .into();
    assert_eq!(s.asc, asc::INVALID_FIELD_IN_CDB);
    assert_eq!(s.key_specific, Some([0xcb, 0, 1]));
    let s: Sense = CdbError::InvalidServiceAction {
        opcode: 0xa3,
        service_action: 0x1f,
    }
    .into();
    // libiscsi reads field pointer 1 as "not implemented".
    assert_eq!(s.key_specific.map(|k| (k[1], k[2])), Some((0, 1)));
}

#[test]
fn emit_into_small_buffer_fails() {
    let c = Command::TestUnitReady { control: 0 };
    let mut small = [0u8; 3];
    assert_eq!(
        c.emit(&mut small),
        Err(CdbError::BufferTooSmall { needed: 6, got: 3 })
    );
}

/// Every operation code the parser knows, with the length it needs.
const KNOWN: &[(u8, usize)] = &[
    (0x00, 6),
    (0x03, 6),
    (0x04, 6),
    (0x08, 6),
    (0x0a, 6),
    (0x12, 6),
    (0x15, 6),
    (0x16, 6),
    (0x17, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x25, 10),
    (0x28, 10),
    (0x2a, 10),
    (0x2e, 10),
    (0x2f, 10),
    (0x34, 10),
    (0x35, 10),
    (0x37, 10),
    (0x41, 10),
    (0x42, 10),
    (0x48, 10),
    (0x4d, 10),
    (0x55, 10),
    (0x56, 10),
    (0x57, 10),
    (0x5a, 10),
    (0x5e, 10),
    (0x5f, 10),
    (0x83, 16),
    (0x84, 16),
    (0x88, 16),
    (0x89, 16),
    (0x8a, 16),
    (0x8b, 16),
    (0x8e, 16),
    (0x8f, 16),
    (0x90, 16),
    (0x91, 16),
    (0x93, 16),
    (0x9c, 16),
    (0x9e, 16),
    (0xa0, 12),
    (0xa3, 12),
    (0xa8, 12),
    (0xaa, 12),
    (0xae, 12),
    (0xaf, 12),
    (0xb7, 12),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// parse -> emit is the identity on the command's bytes, for every
    /// command: random bytes after a known opcode either are refused or
    /// re-emit unchanged.
    #[test]
    fn parse_emit_identity(idx in 0..KNOWN.len(), body in proptest::collection::vec(any::<u8>(), 15), sparse in any::<u16>()) {
        let (op, len) = KNOWN[idx];
        let mut cdb = vec![op];
        // Clear most bytes half the time so that valid CDBs are common.
        for (i, b) in body.iter().enumerate() {
            cdb.push(if sparse & (1 << i) != 0 { 0 } else { *b });
        }
        if op == 0x9e { cdb[1] = if sparse & 1 == 0 { 0x10 } else { 0x12 }; }
        if op == 0xa3 { cdb[1] = [0x0a, 0x0c, 0x0d][usize::from(sparse % 3)] | (cdb[1] & 0xe0); }
        if let Ok(c) = Command::parse(&cdb) {
            prop_assert_eq!(c.buffer_len(), len);
            let e = c.encode();
            prop_assert_eq!(e.as_ref(), &cdb[..len]);
            prop_assert_eq!(Command::parse(e.as_ref()), Ok(c));
        }
    }

    /// Any bytes: parse never panics, and what parses round-trips.
    #[test]
    fn arbitrary_bytes(cdb in proptest::collection::vec(any::<u8>(), 0..20)) {
        if let Ok(c) = Command::parse(&cdb) {
            let n = c.buffer_len();
            let e = c.encode();
            prop_assert_eq!(e.as_ref(), &cdb[..n]);
        }
    }
}

#[test]
fn every_known_opcode_parses_when_zeroed() {
    for &(op, len) in KNOWN {
        let mut cdb = vec![0u8; len];
        cdb[0] = op;
        if op == 0x9e {
            cdb[1] = 0x10;
        }
        if op == 0xa3 {
            cdb[1] = 0x0c;
        }
        let c = Command::parse(&cdb).unwrap_or_else(|e| panic!("{op:#x}: {e}"));
        assert_eq!(c.encode().as_ref(), &cdb[..], "{op:#x}");
        assert_eq!(c.opcode(), op);
        assert_eq!(cdb_length_of(op), Some(len));
    }
}

/// Every command belongs to exactly one command set, and the set that
/// decodes it is the one that emits it (so `Command::encode` never leaves
/// an empty CDB): each known operation code zeroed, and each service action
/// of SERVICE ACTION IN(16) and MAINTENANCE IN.
type Parse = fn(u8, &[u8]) -> Result<Option<Command>, CdbError>;
type Encode = fn(&Command, &mut [u8; 16]) -> Option<usize>;

#[test]
fn every_command_encodes_in_the_set_that_decodes_it() {
    let mut cdbs: Vec<Vec<u8>> = KNOWN
        .iter()
        .map(|&(op, len)| {
            let mut cdb = vec![0u8; len];
            cdb[0] = op;
            cdb
        })
        .collect();
    for (op, sa) in [
        (0x9e, 0x10),
        (0x9e, 0x12),
        (0xa3, 0x0a),
        (0xa3, 0x0c),
        (0xa3, 0x0d),
    ] {
        let mut cdb = vec![0u8; if op == 0x9e { 16 } else { 12 }];
        cdb[0] = op;
        cdb[1] = sa;
        cdbs.push(cdb);
    }
    let mut seen = 0;
    for cdb in &cdbs {
        let Ok(c) = Command::parse(cdb) else {
            // A zeroed 0x9e or 0xa3 has no service action: refused.
            assert!(matches!(cdb[0], 0x9e | 0xa3), "{:#x}", cdb[0]);
            continue;
        };
        seen += 1;
        let sets: [(Parse, Encode); 4] = [
            (sbc::parse, sbc::encode),
            (spc::parse, spc::encode),
            (pr::parse, pr::encode),
            (copy::parse, copy::encode),
        ];
        let decoders: Vec<usize> = (0..sets.len())
            .filter(|&i| matches!((sets[i].0)(cdb[0], cdb), Ok(Some(_))))
            .collect();
        let encoders: Vec<usize> = (0..sets.len())
            .filter(|&i| (sets[i].1)(&c, &mut [0u8; 16]).is_some())
            .collect();
        assert_eq!(decoders.len(), 1, "{c:?}");
        assert_eq!(decoders, encoders, "{c:?}");
        assert_eq!(c.encode().as_ref(), &cdb[..], "{c:?}");
    }
    assert_eq!(seen, KNOWN.len() - 2 + 5);
}
