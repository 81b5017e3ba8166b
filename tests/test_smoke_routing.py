from sqlalchemy import Engine

from connector.core.config import OrgConfig
from connector.routing.assign import Lead, Router


def test_assign_one(engine: Engine, applied: OrgConfig) -> None:
    r = Router(engine, applied)
    o = r.assign(Lead("00Q1", {"Country": "US"}), "api")
    assert o.status == "assigned" and o.team == "na_ae"
    o2 = r.assign(Lead("00Q1", {"Country": "FR"}), "api")
    assert o2.status == "duplicate" and o2.owner_id == o.owner_id
    outs = r.assign_many([Lead(f"00Q{i}", {"Country": "DE"}) for i in range(2, 12)], "import")
    assert [o.owner_name for o in outs][:3] == ["Grace Hopper", "Edsger Dijkstra", "Barbara Liskov"]
