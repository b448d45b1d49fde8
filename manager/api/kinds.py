"""/api/kinds"""

from __future__ import annotations

from fastapi import APIRouter

from manager.api.deps import SessionDep
from manager.api.schemas import ERRORS, KindOut
from manager.kinds import KindCatalog
from shared.kinds import BUILTIN_KINDS

router = APIRouter(prefix="/api/kinds", tags=["kinds"], responses=ERRORS)


@router.get("", response_model=list[KindOut])
async def list_kinds(session: SessionDep) -> list[KindOut]:
    """Kinds the live services offer (built-ins are always listed), with their args schemas."""
    catalog = await KindCatalog.load(session)
    return [
        KindOut(
            name=name,
            description=offered.info.description,
            isolation=offered.info.isolation,
            rebalance=offered.info.rebalance,
            args_schema=offered.info.args_schema,
            builtin=name in BUILTIN_KINDS,
            pools=sorted(offered.pools),
            services=offered.services,
        )
        for name, offered in sorted(catalog.kinds.items())
    ]
